//! What every decision of a limit kept in Redis shares ([`RedisDeciderState`]): the
//! settings, the health of Redis and its episodes, the cap on new keys, the local
//! reservation; one script call within a deadline, the failures and the return; and the
//! probe that follows Redis while it is away (and while no request asks it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::{Clock, saturating_nanos};
use overload_core::telemetry::{Episode, LayerName, LazyMetrics};
use redis::{Arg, Cmd, ErrorKind, RedisError, ServerErrorKind};
use tokio::sync::Notify;

use super::command::evalsha;
use super::connection::RedisConnection;
use super::script::{ScriptReply, ScriptedLimit};
use super::store::RedisStore;
use crate::algorithm::{Limiter, TokenBucket};
use crate::keyed::KeyClass;
use crate::rate_limit::remote_decision::RemoteFallback;
use crate::remote_health::RemoteHealth;
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
    /// New keys per second this process may make in Redis (keyed limits).
    pub(crate) max_new_keys: u32,
    /// The local reservation's largest batch and its lease, if any.
    pub(crate) reservation: Option<(u32, Duration)>,
    pub(crate) name: LayerName,
}

/// How long the episode of new keys over the cap lasts without one: 10 s.
pub(super) const OVERFLOW_QUIET: Duration = Duration::from_secs(10);

/// What every decision in flight, and the probes, share.
pub(super) struct RedisDeciderState<C> {
    pub(super) settings: RedisSettings,
    pub(super) clock: C,
    /// Whether Redis decides, with an epoch per return.
    pub(super) health: RemoteHealth,
    /// Redis away: begun by the first failure (`WARN`), ended by the probe (`INFO`).
    pub(super) away: Episode,
    /// The key of the decision whose failure turned Redis away: what the probe asks about,
    /// so that a Cluster is back when that key's slot answers.
    pub(super) probe_key: Mutex<Option<Vec<u8>>>,
    /// Whether a decision met a replica (`READONLY`): a failover behind one address (a DNS
    /// name, a proxy) left the connection on the old master; the probe replaces it.
    pub(super) read_only: AtomicBool,
    /// Whether a request asked Redis since the last tick.
    pub(super) asked: AtomicBool,
    /// Whether a probe is under way.
    pub(super) probing: AtomicBool,
    /// Whether the ticker runs.
    pub(super) started: AtomicBool,
    /// The cap on new keys: a token bucket of `max_new_keys` per second.
    pub(super) new_keys: (TokenBucket, <TokenBucket as Limiter>::State),
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
    pub(super) class: KeyClass,
    /// The health when the request started.
    pub(super) observed: u64,
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
        Ok(Arc::new_cyclic(|this| Self {
            settings,
            clock,
            health: RemoteHealth::new(),
            away: Episode::new(),
            probe_key: Mutex::new(None),
            read_only: AtomicBool::new(false),
            asked: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            started: AtomicBool::new(false),
            new_keys: (new_keys, Default::default()),
            overflowing: Episode::new(),
            reservation,
            refill_done: Notify::new(),
            metrics,
            this: Weak::clone(this),
        }))
    }
    /// One script call within the deadline; its failure is counted, and may turn Redis
    /// away.
    pub(super) async fn ask(
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
        Err(RemoteFallback)
    }

    /// Whether a keyed request may make its key in Redis: while the cap on new keys has a
    /// unit left.
    pub(super) fn may_make_key(&self) -> bool {
        let (bucket, taken) = &self.new_keys;
        bucket.status(taken, self.clock.now()).remaining >= 1
    }

    pub(super) fn over_budget(&self) -> RedisError {
        RedisError::from((
            ErrorKind::Io,
            "no answer within the time budget",
            format!("{:?}", self.settings.budget),
        ))
    }

    /// A request that started at `observed` could not be decided in Redis: it falls back,
    /// counted; and Redis is away, unless it came back since the request started.
    pub(super) fn failed(
        &self,
        reason: RedisFallbackReason,
        error: &RedisError,
        observed: u64,
        cmd: Option<&Cmd>,
    ) {
        self.metrics.get().fallback(reason).increment(1);
        if error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
            self.read_only.store(true, Ordering::Release);
        }
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
    pub(super) fn turned_away(
        &self,
        reason: RedisFallbackReason,
        error: &RedisError,
        observed: u64,
    ) -> bool {
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
        runtime.spawn(async move {
            this.probe().await;
            this.probing.store(false, Ordering::Release);
        });
    }

    /// Asks Redis about the key whose decision failed (`EXISTS`, which goes to that key's
    /// node in a Cluster), or `PING`s it: an answer within the budget brings it back. A
    /// connection that does not answer within the response timeout is replaced at once (a
    /// black hole), and the new one asked.
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
