//! The layer's remote decision in Redis: the time budget, the fallback and the way back.

use std::borrow::Cow;
use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::request::Parts;
use metrics::{Counter, Gauge};
use overload_core::clock::Clock;
use redis::aio::ConnectionManager;
use redis::{Cmd, ErrorKind, RedisError, RedisWrite, ServerErrorKind, ToRedisArgs, Value};

use super::key::RedisKey;
use super::script::Scripted;
use super::store::RedisStore;
use crate::key::{KeyExtractor, MissingKey};
use crate::keyed::KeyClass;
use crate::layer::remote::{Fallback, RemoteDecide, RemoteDecision, RemoteOutcome};
use crate::layer::shared::MissingKeyPolicy;
use crate::metric_names;

/// What a layer's Redis limit needs besides its limiter and key extractor.
pub(crate) struct RemoteSettings {
    pub(crate) store: RedisStore,
    pub(crate) scripted: Scripted,
    /// `{prefix}:{policy}:{algorithm}:`.
    pub(crate) namespace: Vec<u8>,
    pub(crate) budget: Duration,
    /// Nanoseconds between two attempts to ask Redis again while it is away.
    pub(crate) recheck: u64,
    pub(crate) capacity: u64,
    pub(crate) policy: String,
}

/// A limit kept in Redis: [`RemoteDecide`] for the layer.
pub(crate) struct RedisRemote<E, C> {
    shared: Arc<RemoteShared<C>>,
    /// `None` for one global limit.
    extract: Option<E>,
    /// What to do with a request without a key (a keyed limit's, shared with the local one).
    missing: Option<Arc<MissingKeyPolicy>>,
}

/// What every decision in flight shares.
struct RemoteShared<C> {
    settings: RemoteSettings,
    clock: C,
    /// `UP` while Redis decides; otherwise the clock time (nanoseconds) from which one
    /// request may ask Redis again.
    state: AtomicU64,
    metrics: RemoteMetrics,
}

const UP: u64 = 0;

impl<E, C: Clock> RedisRemote<E, C> {
    pub(crate) fn new(
        settings: RemoteSettings,
        clock: C,
        extract: Option<E>,
        missing: Option<Arc<MissingKeyPolicy>>,
    ) -> Self {
        let metrics = RemoteMetrics::new(&settings.policy);
        Self {
            shared: Arc::new(RemoteShared {
                settings,
                clock,
                state: AtomicU64::new(UP),
                metrics,
            }),
            extract,
            missing,
        }
    }
}

impl<E, C> RemoteDecide for RedisRemote<E, C>
where
    E: KeyExtractor,
    E::Lookup: RedisKey,
    C: Clock,
{
    fn start(&self, parts: &Parts, cost: u32) -> Option<RemoteDecision> {
        let shared = &*self.shared;
        let settings = &shared.settings;
        if cost == 0 || u64::from(cost) > settings.capacity {
            // NOTE: free, or never admissible: the local decision is the same as Redis's,
            // without the round trip. Not a fallback.
            return None;
        }
        // NOTE: the key first: a request that the missing-key policy decides without a
        // limit (rejected, or admitted) never asks Redis, so it is not a fallback either
        // when Redis is away.
        let target = match &self.extract {
            None => Target::Global,
            Some(extract) => match extract.extract(parts) {
                Some(key) => Target::Keyed(key),
                None => match self.missing.as_deref() {
                    // The local decision applies the policy (and logs and counts it, once).
                    Some(m) if m.policy() != MissingKey::Shared => return None,
                    _ => Target::Unkeyed,
                },
            },
        };
        if !shared.may_ask() {
            shared.metrics.fallback(Reason::Unavailable);
            return None;
        }
        let connection = match settings.store.connection() {
            Ok(connection) => connection,
            Err(e) => {
                shared.failed(Reason::Error, &e);
                return None;
            }
        };
        let (cmd, class) = match target {
            Target::Global => (
                command::<()>(settings, KeyName::Global, cost, None),
                KeyClass::Global,
            ),
            Target::Keyed(key) => (
                command(settings, KeyName::Keyed(&*key), cost, None),
                KeyClass::Keyed,
            ),
            Target::Unkeyed => {
                // NOTE: counted here; if Redis then fails to answer, the local fallback
                // counts the request a second time.
                if let Some(missing) = self.missing.as_deref() {
                    missing.apply();
                }
                (
                    command::<()>(settings, KeyName::Unkeyed, cost, None),
                    KeyClass::Unkeyed,
                )
            }
        };
        let shared = Arc::clone(&self.shared);
        Some(RemoteDecision::new(decide(
            shared, connection, cmd, cost, class,
        )))
    }
}

/// What a request's decision is asked of Redis about.
enum Target<'a, L: ?Sized + ToOwned> {
    /// The layer's one global limit.
    Global,
    /// The request's key.
    Keyed(Cow<'a, L>),
    /// A keyed limit's request without a key, under `MissingKey::Shared`: one bucket for all.
    Unkeyed,
}

/// One decision: the script within the budget, its reply read, the health updated.
async fn decide<C: Clock>(
    shared: Arc<RemoteShared<C>>,
    mut connection: ConnectionManager,
    cmd: Cmd,
    cost: u32,
    class: KeyClass,
) -> RemoteOutcome {
    let settings = &shared.settings;
    let reply = tokio::time::timeout(
        settings.budget,
        evalsha(&mut connection, &cmd, settings.scripted.code),
    )
    .await;
    match reply {
        Ok(Ok(value)) => match settings.scripted.read_reply(&value, cost) {
            Ok((decision, status)) => {
                shared.answered();
                Ok((decision, status, class))
            }
            Err(unexpected) => {
                let e = RedisError::from((
                    ErrorKind::Client,
                    "unexpected reply from the rate limit script",
                    unexpected.0,
                ));
                shared.failed(Reason::Error, &e);
                Err(Fallback)
            }
        },
        Ok(Err(e)) => {
            shared.failed(Reason::Error, &e);
            Err(Fallback)
        }
        Err(_elapsed) => {
            let e = RedisError::from((
                ErrorKind::Io,
                "no answer within the time budget",
                format!("{:?}", settings.budget),
            ));
            shared.failed(Reason::Timeout, &e);
            Err(Fallback)
        }
    }
}

/// `EVALSHA`; on `NOSCRIPT` (a restarted or flushed Redis), `SCRIPT LOAD` and once more.
///
/// A server's error reply comes back as a value (redis-rs's `Value::ServerError`), made an
/// error here.
pub(crate) async fn evalsha(
    connection: &mut ConnectionManager,
    cmd: &Cmd,
    code: &str,
) -> Result<Value, RedisError> {
    match connection.send_packed_command(cmd).await?.extract_error() {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(code);
            connection
                .send_packed_command(&load)
                .await?
                .extract_error()?;
            connection.send_packed_command(cmd).await?.extract_error()
        }
        other => other,
    }
}

/// Which limit a command names.
pub(crate) enum KeyName<'a, K: ?Sized> {
    Global,
    Unkeyed,
    Keyed(&'a K),
}

/// The key argument: the namespace and the limit's name, written straight into the
/// command's buffer.
struct KeyArg<'a, K: ?Sized> {
    namespace: &'a [u8],
    name: KeyName<'a, K>,
}

impl<K: RedisKey + ?Sized> ToRedisArgs for KeyArg<'_, K> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let mut arg = out.writer_for_next_arg();
        // NOTE: the command's buffer is a `Vec`, whose writes never fail.
        let _ = arg.write_all(self.namespace);
        let _ = match self.name {
            KeyName::Global => arg.write_all(b"g"),
            KeyName::Unkeyed => arg.write_all(b"u"),
            KeyName::Keyed(key) => arg.write_all(b"k:").and_then(|()| key.write_key(&mut arg)),
        };
    }
}

/// `EVALSHA hash 1 key ARGV...` for a request of `cost`; `now_micros` only in tests.
pub(crate) fn command<K: RedisKey + ?Sized>(
    settings: &RemoteSettings,
    name: KeyName<'_, K>,
    cost: u32,
    now_micros: Option<u64>,
) -> Cmd {
    let scripted = &settings.scripted;
    // NOTE: 8 arguments and their bytes, so that writing them never reallocates: "EVALSHA",
    // the 40-digit hash, "1", the key (the namespace and up to 64 bytes of key, typical of
    // an address or an API key), and four short numbers.
    let mut cmd = Cmd::with_capacity(8, 64 + settings.namespace.len() + 64 + 4 * 24);
    cmd.arg("EVALSHA")
        .arg(scripted.hash.as_bytes())
        .arg(1)
        .arg(KeyArg {
            namespace: &settings.namespace,
            name,
        });
    scripted.write_args(&mut cmd, cost, now_micros);
    cmd
}

impl<C: Clock> RemoteShared<C> {
    /// Whether this request may ask Redis: always while it is up; while it is away, one
    /// request per recheck interval, which claims the turn.
    #[inline]
    fn may_ask(&self) -> bool {
        let state = self.state.load(Ordering::Acquire);
        if state == UP {
            return true;
        }
        let now = self.clock.now();
        now >= state
            && self
                .state
                .compare_exchange(
                    state,
                    self.next_recheck(now),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Never `UP`, so that "away" cannot be mistaken for "up" at the clock's origin.
    fn next_recheck(&self, now: u64) -> u64 {
        now.saturating_add(self.settings.recheck).max(1)
    }

    /// Redis answered: decisions go to Redis again.
    fn answered(&self) {
        // NOTE: registers the metrics (the `up` gauge at 1) on the first answer.
        let up = self.metrics.up();
        // NOTE: read first, so that the usual case (already up) writes nothing shared.
        if self.state.load(Ordering::Acquire) != UP && self.state.swap(UP, Ordering::AcqRel) != UP {
            up.set(1.0);
            tracing::info!(
                policy = %self.settings.policy,
                redis = %self.settings.store.addr(),
                "Redis answers again: the rate limit is shared by the fleet again"
            );
        }
    }

    /// Redis could not decide: this request falls back, and the first failure while up
    /// is logged once.
    fn failed(&self, reason: Reason, error: &RedisError) {
        self.metrics.fallback(reason);
        let next = self.next_recheck(self.clock.now());
        if self
            .state
            .compare_exchange(UP, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.metrics.up().set(0.0);
            tracing::warn!(
                policy = %self.settings.policy,
                redis = %self.settings.store.addr(),
                reason = reason.as_str(),
                error = %error,
                "Redis cannot decide the rate limit: each process applies its local share \
                 until Redis answers again"
            );
        } else {
            tracing::debug!(reason = reason.as_str(), error = %error, "Redis still away");
        }
    }
}

/// Why a request was decided locally.
#[derive(Clone, Copy, Debug)]
enum Reason {
    Timeout,
    Error,
    Unavailable,
}

impl Reason {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Error => "error",
            Self::Unavailable => "unavailable",
        }
    }
}

/// The Redis metrics, registered on first use and kept.
struct RemoteMetrics {
    policy: String,
    handles: OnceLock<Handles>,
}

struct Handles {
    /// In the order of [`Reason`].
    fallbacks: [Counter; 3],
    up: Gauge,
}

impl RemoteMetrics {
    fn new(policy: &str) -> Self {
        Self {
            policy: policy.to_owned(),
            handles: OnceLock::new(),
        }
    }

    fn handles(&self) -> &Handles {
        self.handles.get_or_init(|| {
            let counter = |reason: Reason| {
                metrics::counter!(
                    metric_names::REDIS_FALLBACKS,
                    "policy" => self.policy.clone(),
                    "reason" => reason.as_str()
                )
            };
            let up = metrics::gauge!(metric_names::REDIS_UP, "policy" => self.policy.clone());
            up.set(1.0);
            Handles {
                fallbacks: [
                    counter(Reason::Timeout),
                    counter(Reason::Error),
                    counter(Reason::Unavailable),
                ],
                up,
            }
        })
    }

    fn fallback(&self, reason: Reason) {
        self.handles().fallbacks[reason as usize].increment(1);
    }

    fn up(&self) -> &Gauge {
        &self.handles().up
    }
}

impl<E, C> fmt::Debug for RedisRemote<E, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRemote")
            .field("store", &self.shared.settings.store)
            .field("budget", &self.shared.settings.budget)
            .field("up", &(self.shared.state.load(Ordering::Relaxed) == UP))
            .finish_non_exhaustive()
    }
}
