//! A decision of the global limit with the local reservation ([`reserve`]): a request
//! that finds no unit left waits for a batch, which one task at a time asks Redis for,
//! sized to cover the requests that wait; a request whose budget runs out while it waits
//! is decided locally, and leaves the health of Redis to the batch's own round trip.

use std::sync::Arc;
use std::time::Duration;

use overload_core::clock::{Clock, saturating_nanos};

use super::command::{RedisKeyName, command};
use super::connection::RedisConnection;
use super::script::{ScriptArgs, ScriptReply};
use super::state::{Call, RedisDeciderState};
use crate::algorithm::{Decision, QuotaStatus};
use crate::keyed::KeyClass;
use crate::rate_limit::remote_decision::{RemoteFallback, RemoteOutcome};
use crate::remote_health::RemoteHealth;
use crate::reservation::{LocalReservation, ReservedDecision};
use crate::telemetry::RedisFallbackReason;

/// A decision from what the process holds, as the layer reports it.
pub(super) fn reserved(decision: ReservedDecision) -> (Decision, QuotaStatus, KeyClass) {
    match decision {
        ReservedDecision::Allow { remaining, reset } => (
            Decision::Allow,
            QuotaStatus {
                remaining,
                reset: Duration::from_nanos(reset),
            },
            KeyClass::Global,
        ),
        ReservedDecision::Reject { retry_after } => {
            let retry_after = Duration::from_nanos(retry_after);
            (
                Decision::Reject { retry_after },
                QuotaStatus {
                    remaining: 0,
                    reset: retry_after,
                },
                KeyClass::Global,
            )
        }
    }
}

/// The claim on the batch under way, owned by the task that asks for it from when the task
/// is made: released, and the waiters woken, when the answer is in, or when the task goes
/// without one (no answer within the batch's budget, an error, or a runtime that dropped
/// the task), so that a batch is never left claimed.
struct RefillClaim<C> {
    state: Arc<RedisDeciderState<C>>,
    done: bool,
}

impl<C> RefillClaim<C> {
    fn refilled(mut self, now: u64, own: u32, units: u32, status: QuotaStatus) {
        if let Some(reservation) = &self.state.reservation {
            let reset = saturating_nanos(status.reset);
            reservation.refilled_for(now, own, units, status.remaining, reset);
        }
        self.done = true;
        self.state.refill_done.notify_waiters();
    }
}

impl<C> Drop for RefillClaim<C> {
    fn drop(&mut self) {
        if !self.done {
            if let Some(reservation) = &self.state.reservation {
                reservation.refill_failed();
            }
            self.state.refill_done.notify_waiters();
        }
    }
}

/// A request of the global limit that the reservation could not decide at once: it waits,
/// within its budget, for a batch (asking for one if none is under way), and takes its
/// units from it; when a batch it waited for was spent before it woke, it waits for the
/// next within what is left of its budget.
pub(super) async fn reserve<C: Clock>(
    state: Arc<RedisDeciderState<C>>,
    cost: u32,
) -> RemoteOutcome {
    let deadline = tokio::time::Instant::now() + state.settings.budget;
    let Some(reservation) = &state.reservation else {
        return Err(RemoteFallback);
    };
    loop {
        // NOTE: registered before the batch is looked at, so that an answer that comes
        // between the two is not missed.
        let answered = state.refill_done.notified();
        tokio::pin!(answered);
        answered.as_mut().enable();
        if let Some(decided) = reservation.decide(state.clock.now(), cost) {
            refill_ahead(&state);
            return Ok(reserved(decided));
        }
        let observed = state.health.observe();
        if !RemoteHealth::is_up(observed) {
            // NOTE: a batch's round trip found Redis away.
            state.fell_back(RedisFallbackReason::Unavailable);
            return Err(RemoteFallback);
        }
        if reservation.claim_refill() {
            spawn_refill(&state, Refill::Waiting { cost }, observed);
        } else {
            reservation.waiting(cost);
        }
        if tokio::time::timeout_at(deadline, answered).await.is_err() {
            // NOTE: a last look: the batch may have come in the same turn of the runtime as
            // the deadline (a runtime that was not scheduled for a while).
            if let Some(decided) = reservation.decide(state.clock.now(), cost) {
                return Ok(reserved(decided));
            }
            // NOTE: the budget ran out while a batch was under way: decided locally. Whether
            // Redis answers in time is the batch's to say (its round trip has a budget of
            // its own), not this request's, which spent its budget waiting: no failure is
            // counted here.
            state.fell_back(RedisFallbackReason::Timeout);
            return Err(RemoteFallback);
        }
    }
}

/// After a decision from the batch: if it runs low, the next is asked for now, so that
/// requests do not wait for it.
#[inline]
pub(super) fn refill_ahead<C: Clock>(state: &Arc<RedisDeciderState<C>>) {
    if let Some(reservation) = &state.reservation {
        if reservation.running_low(state.clock.now()) && reservation.claim_refill() {
            spawn_refill(state, Refill::Ahead, state.health.observe());
        }
    }
}

/// Who asks for a batch.
#[derive(Clone, Copy)]
pub(super) enum Refill {
    /// A request that found too few units, and waits: the batch holds its `cost`.
    Waiting { cost: u32 },
    /// A request that left the batch running low: the next is asked for ahead.
    Ahead,
}

/// Asks Redis for a batch in a task of its own, claimed already: the batch comes in
/// whatever happens to the request that asked for it (a client gone, its budget over), and
/// its round trip has a whole budget, which it is judged by.
pub(super) fn spawn_refill<C: Clock>(
    state: &Arc<RedisDeciderState<C>>,
    refill: Refill,
    observed: u64,
) {
    // NOTE: made first, so that every way out below releases the claim.
    let claim = RefillClaim {
        state: Arc::clone(state),
        done: false,
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        let e = redis::RedisError::from((
            redis::ErrorKind::Client,
            "a Redis-backed rate limit must run inside a tokio runtime",
        ));
        state.failed(RedisFallbackReason::Error, &e, observed, None);
        return;
    };
    let connection = match state.settings.store.connection() {
        Ok((connection, _)) => connection,
        Err(e) => {
            state.failed(RedisFallbackReason::Error, &e, observed, None);
            return;
        }
    };
    state.mark_asked();
    runtime.spawn(ask_for_batch(claim, connection, refill, observed));
}

async fn ask_for_batch<C: Clock>(
    claim: RefillClaim<C>,
    mut connection: RedisConnection,
    refill: Refill,
    observed: u64,
) {
    let state = Arc::clone(&claim.state);
    let Some(reservation) = &state.reservation else {
        return;
    };
    let batch = reservation.batch(state.clock.now());
    let cost = match refill {
        Refill::Waiting { cost } => cost,
        // NOTE: the units held are as many as a batch may hold: nothing to ask for.
        Refill::Ahead if batch == 0 => return,
        Refill::Ahead => 1,
    };
    let settings = &state.settings;
    let args = ScriptArgs {
        extra: batch.saturating_sub(cost),
        ..ScriptArgs::cost(cost)
    };
    let cmd = command(
        &settings.scripted,
        &settings.namespace,
        &RedisKeyName::Global,
        args,
    );
    let (awaited, own) = match refill {
        Refill::Waiting { cost } => (true, cost),
        Refill::Ahead => (false, 0),
    };
    let call = Call {
        cost,
        held: 0,
        class: KeyClass::Global,
        observed,
        awaited,
    };
    let deadline = tokio::time::Instant::now() + settings.budget;
    let script = state.call_script(&mut connection, &cmd);
    tokio::pin!(script);
    let reply = tokio::time::timeout_at(deadline, &mut script).await;
    // NOTE: a failure was counted by `judge` (if requests wait for this batch); the global
    // key may always be made, so a reply that says otherwise is not the script's.
    let reply = match state.judge(reply.map_err(drop), &cmd, call) {
        Ok(reply) => reply,
        Err(RedisFallbackReason::Timeout) => {
            // NOTE: past its budget: the claim is given up now, so that another batch may
            // be asked for (and another failure counted), but what Redis took for this one
            // is still kept if it comes within a lease.
            drop(claim);
            let lease = settings
                .reservation
                .map_or(settings.budget, |(_, lease)| lease);
            let late = tokio::time::timeout(lease, script).await;
            let Ok(Ok(value)) = late else { return };
            if let Ok(reply) = settings.scripted.read_reply(&value, cost) {
                if let Some((units, status)) = batch_units(reservation, &reply, cost, &state) {
                    let reset = saturating_nanos(status.reset);
                    let now = state.clock.now();
                    reservation.came_late(now, own, units, status.remaining, reset);
                    // NOTE: requests may wait for the batch claimed since: this one serves.
                    state.refill_done.notify_waiters();
                }
            }
            return;
        }
        Err(_) => return,
    };
    if let Some((units, status)) = batch_units(reservation, &reply, cost, &state) {
        claim.refilled(state.clock.now(), own, units, status);
    }
}

/// The units a batch's reply brings (the asking request's own, which go into the batch for
/// whichever request takes them, and the extra), and what Redis had left; a rejection is
/// kept first, so that the waiters the batch wakes see it.
fn batch_units<C: Clock>(
    reservation: &LocalReservation,
    reply: &ScriptReply,
    cost: u32,
    state: &RedisDeciderState<C>,
) -> Option<(u32, QuotaStatus)> {
    let ScriptReply::Decided {
        decision,
        status,
        extra,
        ..
    } = *reply
    else {
        return None;
    };
    let units = match decision {
        Decision::Allow => cost.saturating_add(extra),
        Decision::Reject { retry_after } => {
            reservation.rejected(state.clock.now(), saturating_nanos(retry_after), cost);
            extra
        }
        // NOTE: never: a request above the capacity is decided locally, without Redis.
        Decision::OverCapacity { .. } => extra,
    };
    Some((units, status))
}
