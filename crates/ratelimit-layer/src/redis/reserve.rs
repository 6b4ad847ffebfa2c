//! A decision of the global limit with the local reservation ([`reserve`]): one request
//! at a time asks Redis for a batch with its own unit; the others that find nothing left
//! wait for that answer (within their budget) instead of each asking Redis.

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

/// The claim on the batch under way: released (the waiters woken) when the answer is in,
/// or when the request is dropped before it (a client gone), so that a batch is never
/// left claimed.
struct RefillClaim<'a> {
    reservation: &'a LocalReservation,
    notify: &'a tokio::sync::Notify,
    done: bool,
}

impl RefillClaim<'_> {
    fn refilled(mut self, now: u64, units: u32, status: QuotaStatus) {
        self.reservation
            .refilled(now, units, status.remaining, saturating_nanos(status.reset));
        self.done = true;
        self.notify.notify_waiters();
    }
}

impl Drop for RefillClaim<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.reservation.refill_failed();
            self.notify.notify_waiters();
        }
    }
}

/// A request of the global limit that the reservation could not decide at once.
pub(super) async fn reserve<C: Clock>(
    state: Arc<RedisDeciderState<C>>,
    mut connection: RedisConnection,
    call: Call,
) -> RemoteOutcome {
    let settings = &state.settings;
    let deadline = tokio::time::Instant::now() + settings.budget;
    let Some(reservation) = &state.reservation else {
        return Err(RemoteFallback);
    };
    // NOTE: registered before the flag is read, so that an answer that comes between the
    // two is not missed.
    let answered = state.refill_done.notified();
    tokio::pin!(answered);
    answered.as_mut().enable();
    if reservation.is_refilling() {
        let _ = tokio::time::timeout_at(deadline, answered).await;
        if let Some(decided) = reservation.decide(state.clock.now(), call.cost) {
            return Ok(reserved(decided));
        }
        if !RemoteHealth::is_up(state.health.observe()) {
            // NOTE: the batch's request found Redis away.
            state
                .metrics
                .get()
                .fallback(RedisFallbackReason::Unavailable)
                .increment(1);
            return Err(RemoteFallback);
        }
    }
    let extra = reservation.claim_refill(state.clock.now());
    let claim = (extra > 0).then_some(RefillClaim {
        reservation,
        notify: &state.refill_done,
        done: false,
    });
    let args = ScriptArgs {
        extra,
        ..ScriptArgs::cost(call.cost)
    };
    let cmd = command::<()>(
        &settings.scripted,
        &settings.namespace,
        &RedisKeyName::Global,
        args,
    );
    let ScriptReply::Decided {
        decision,
        mut status,
        extra,
        ..
    } = state.ask(&mut connection, &cmd, deadline, call).await?
    else {
        // NOTE: the global key may always be made; a reply that says otherwise is not the
        // script's.
        return Err(RemoteFallback);
    };
    let now = state.clock.now();
    // NOTE: the rejection kept first, then the claim released: the waiters it wakes see it.
    if let Decision::Reject { retry_after } = decision {
        reservation.rejected(now, saturating_nanos(retry_after), call.cost);
    }
    if let Some(claim) = claim {
        claim.refilled(now, extra, status);
        // NOTE: the units this process now holds are the fleet's too.
        status.remaining = status.remaining.saturating_add(u64::from(extra));
    }
    Ok((decision, status, KeyClass::Global))
}
