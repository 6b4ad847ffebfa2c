//! A limit kept in Redis as the layer's remote decision ([`RedisDecider`]): which limit a
//! request asks about, whether Redis is asked at all, and one decision within the budget
//! (with, for a new key over the cap, the overflow limit's).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use overload_core::ConfigError;
use overload_core::clock::Clock;
use redis::{Cmd, ErrorKind, RedisError};

use super::command::{RedisKeyName, command};
use super::connection::RedisConnection;
use super::key::RedisKey;
use super::reserve::{refill_ahead, reserve, reserved};
use super::script::{ScriptArgs, ScriptReply};
use super::secret::KeyNamer;
use super::state::{Call, OVERFLOW_QUIET, RedisDeciderState, RedisSettings};
use crate::algorithm::Limiter;
use crate::key::{KeyExtractor, MissingKey};
use crate::keyed::{KeyClass, network_of};
use crate::rate_limit::decide::{MissingKeyPolicy, Shedding};
use crate::rate_limit::remote_decision::{
    RemoteDecide, RemoteDecision, RemoteFallback, RemoteOutcome, RemoteStart,
};
use crate::remote_health::RemoteHealth;
use crate::telemetry::RedisFallbackReason;
use overload_signal::protocol::Criticality;

/// A limit kept in Redis: [`RemoteDecide`] for the layer.
pub(crate) struct RedisDecider<E, C> {
    state: Arc<RedisDeciderState<C>>,
    /// The layer's shedding from the bottom, shared with its local fallback.
    shed: Option<Arc<Shedding>>,
    /// `None` for one global limit.
    extract: Option<E>,
    /// What to do with a request without a key (a keyed limit's, shared with the local one).
    missing: Option<Arc<MissingKeyPolicy>>,
}

impl<E, C: Clock> RedisDecider<E, C> {
    pub(crate) fn new(
        settings: RedisSettings,
        clock: C,
        extract: Option<E>,
        missing: Option<Arc<MissingKeyPolicy>>,
        shed: Option<Arc<Shedding>>,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            state: RedisDeciderState::new(settings, clock)?,
            shed,
            extract,
            missing,
        })
    }
}

impl<E, C> RemoteDecide for RedisDecider<E, C>
where
    E: KeyExtractor,
    E::Lookup: RedisKey,
    C: Clock,
{
    fn start(&self, parts: &Parts, cost: u32) -> RemoteStart {
        // NOTE: one relaxed load while the recheck runs; started again on this request's
        // runtime when the one that ran it has shut down.
        self.state.start_ticker();
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
            state.fell_back(RedisFallbackReason::Unavailable);
            return RemoteStart::Local;
        }
        // NOTE: the level's held-back share of the fleet's capacity; the local fallback
        // notes the level again, harmlessly, if it decides.
        let held = self.shed.as_deref().map_or(0, |shed| {
            shed.held_back(
                Criticality::of(&parts.extensions),
                settings.capacity,
                state.clock.now(),
            )
        });
        // NOTE: the reservation's units are for requests with nothing held back; a request
        // with a share held back asks Redis, which knows what is left.
        if let (RedisTarget::Global, Some(reservation), 0) = (&target, &state.reservation, held) {
            if let Some(decided) = reservation.decide(state.clock.now(), cost) {
                refill_ahead(&self.state);
                let (decision, status, class) = reserved(decided);
                return RemoteStart::Decided(decision, status, class);
            }
            state.mark_asked();
            let state = Arc::clone(&self.state);
            return RemoteStart::Pending(RemoteDecision::new(reserve(state, cost)));
        }
        let connection = match settings.store.connection() {
            Ok((connection, _)) => connection,
            Err(e) => {
                state.failed(RedisFallbackReason::Error, &e, observed, None);
                state.fell_back(RedisFallbackReason::Error);
                return RemoteStart::Local;
            }
        };
        state.mark_asked();
        let mut call = Call {
            cost,
            held,
            class: KeyClass::Global,
            observed,
            awaited: true,
        };
        let (scripted, namespace) = (&settings.scripted, settings.namespace.as_slice());
        let mut args = ScriptArgs::cost(cost);
        args.held = held;
        let deadline = tokio::time::Instant::now() + settings.budget;
        let (cmd, overflow) = match target {
            RedisTarget::Global => (
                command(scripted, namespace, &RedisKeyName::Global, args),
                None,
            ),
            RedisTarget::Keyed(key) => {
                call.class = KeyClass::Keyed;
                args.may_create = state.may_make_key();
                // NOTE: only a key that may not be made can meet the overflow: the client's
                // network is looked up for those alone.
                let network = (!args.may_create)
                    .then(|| network_of(self.extract.as_ref().and_then(|e| e.client_addr(parts))));
                let Some(namer) = settings.secret.namer() else {
                    // NOTE: the secret is not known yet (the layer's first keyed requests):
                    // the key's bytes are kept until it is.
                    let mut plain = Vec::new();
                    let _ = key.write_key(&mut plain);
                    return RemoteStart::Pending(RemoteDecision::new(load_then_decide(
                        Arc::clone(&self.state),
                        connection,
                        plain,
                        args,
                        call,
                        network,
                        deadline,
                    )));
                };
                let name = RedisKeyName::Keyed(namer.name(&*key));
                (
                    command(scripted, namespace, &name, args),
                    network.map(|network| (namer, network)),
                )
            }
            RedisTarget::Unkeyed => {
                call.class = KeyClass::Unkeyed;
                // NOTE: counted here; if Redis then fails to answer, the local fallback
                // counts the request a second time.
                if let Some(missing) = self.missing.as_deref() {
                    missing.apply();
                }
                (
                    command(scripted, namespace, &RedisKeyName::Unkeyed, args),
                    None,
                )
            }
        };
        RemoteStart::Pending(RemoteDecision::new(decide(
            Arc::clone(&self.state),
            connection,
            cmd,
            call,
            overflow,
            deadline,
        )))
    }

    fn first_request(&self) {
        self.state.start_ticker();
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

/// The layer's first keyed decisions, before the fleet's secret is known: the secret read
/// from Redis (made there if no process has yet), then the decision, within one budget.
async fn load_then_decide<C: Clock>(
    state: Arc<RedisDeciderState<C>>,
    mut connection: RedisConnection,
    plain: Vec<u8>,
    args: ScriptArgs,
    call: Call,
    network: Option<u64>,
    deadline: tokio::time::Instant,
) -> RemoteOutcome {
    let settings = &state.settings;
    let loaded = tokio::time::timeout_at(deadline, settings.secret.load(&mut connection)).await;
    let namer = match loaded {
        Ok(Ok(namer)) => namer,
        Ok(Err(e)) => {
            state.failed(RedisFallbackReason::Error, &e, call.observed, None);
            state.fell_back(RedisFallbackReason::Error);
            return Err(RemoteFallback);
        }
        Err(_elapsed) => {
            let e = state.over_budget();
            state.failed(RedisFallbackReason::Timeout, &e, call.observed, None);
            state.fell_back(RedisFallbackReason::Timeout);
            return Err(RemoteFallback);
        }
    };
    let name = RedisKeyName::Keyed(namer.name(plain.as_slice()));
    let cmd = command(&settings.scripted, &settings.namespace, &name, args);
    let overflow = network.map(|network| (namer, network));
    decide(state, connection, cmd, call, overflow, deadline).await
}

/// One decision: the script within the budget (and, for a new key over the cap, its
/// network's overflow limit's within what is left of it, or the last overflow limit's),
/// its reply read. `overflow` is the namer and the network of a key that may not be made.
async fn decide<C: Clock>(
    state: Arc<RedisDeciderState<C>>,
    mut connection: RedisConnection,
    cmd: Cmd,
    call: Call,
    overflow: Option<(KeyNamer, u64)>,
    deadline: tokio::time::Instant,
) -> RemoteOutcome {
    let settings = &state.settings;
    let mut class = call.class;
    let fell_back = |reason| {
        state.fell_back(reason);
        RemoteFallback
    };
    let mut reply = state
        .ask(&mut connection, &cmd, deadline, call)
        .await
        .map_err(fell_back)?;
    let mut network_made = false;
    if reply == ScriptReply::NoSuchKey {
        // NOTE: a new key over the cap: the request is decided against its network's
        // overflow limit (made while the cap on new networks allows), or else the last
        // one, as the local map does at its cap.
        if state.overflowing.seen(state.clock.now()) {
            tracing::warn!(
                name = %settings.name,
                max_new_keys = settings.max_new_keys,
                "ratelimit-layer: more new rate-limit keys than the cap allows; their requests \
                 share their network's overflow limit in Redis (logged once; `INFO` once none \
                 has come for {OVERFLOW_QUIET:?})"
            );
        }
        class = KeyClass::Overflow;
        if let Some((namer, network)) = &overflow {
            let mut args = ScriptArgs::cost(call.cost);
            args.held = call.held;
            args.may_create = state.may_make_network();
            let name = RedisKeyName::NetworkOverflow(namer.name(network));
            let cmd = command(&settings.scripted, &settings.namespace, &name, args);
            reply = state
                .ask(&mut connection, &cmd, deadline, call)
                .await
                .map_err(fell_back)?;
            network_made = matches!(reply, ScriptReply::Decided { made: true, .. });
        }
        if reply == ScriptReply::NoSuchKey {
            let mut args = ScriptArgs::cost(call.cost);
            args.held = call.held;
            let last = command(
                &settings.scripted,
                &settings.namespace,
                &RedisKeyName::Overflow,
                args,
            );
            reply = state
                .ask(&mut connection, &last, deadline, call)
                .await
                .map_err(fell_back)?;
        }
    }
    if network_made {
        let (bucket, taken) = &state.new_networks;
        let _ = bucket.check(taken, state.clock.now(), 1);
    }
    let ScriptReply::Decided {
        decision,
        status,
        made,
        ..
    } = reply
    else {
        let e = RedisError::from((
            ErrorKind::Client,
            "the overflow key does not exist and may not be made",
        ));
        state.failed(RedisFallbackReason::Error, &e, call.observed, Some(&cmd));
        return Err(fell_back(RedisFallbackReason::Error));
    };
    if made && class == KeyClass::Keyed {
        let (bucket, taken) = &state.new_keys;
        // NOTE: a unit of the cap, whether there is one or not: requests that found one
        // left while others made keys overshoot the cap by at most their number.
        let _ = bucket.check(taken, state.clock.now(), 1);
    }
    Ok((decision, status, class))
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
