//! The level of the request a task is serving: a task-local that a server layer sets and a
//! client layer reads, so that a handler's downstream calls carry its request's level.

use std::future::Future;

use tokio::task::futures::TaskLocalFuture;

use crate::protocol::Criticality;

tokio::task_local! {
    static CURRENT: Option<Criticality>;
}

/// A future running with a current level; see [`scope`].
pub type CriticalityScope<F> = TaskLocalFuture<Option<Criticality>, F>;

/// The level of the request the current task is serving: the one a
/// [`CriticalityLayer`](super::CriticalityLayer) (or [`scope`]) set around the code running
/// now, or the overload layer when it resolves levels (`ratelimit-layer`'s
/// `OverloadProtectionLayer` does); the lower of the two when both did (the overload layer
/// carries its request's level in the scope it already installs for downstream marks, so an
/// enclosing `scope` of a lower level still wins, as a scope never raises an outer one);
/// `None` outside any.
pub fn current() -> Option<Criticality> {
    let task = CURRENT.try_with(|level| *level).ok().flatten();
    match (task, crate::propagation::scoped_level()) {
        (Some(task), Some(scoped)) => Some(task.min(scoped)),
        (task, scoped) => task.or(scoped),
    }
}

/// The level a downstream call carries on the wire: the lower of the level `requested` for
/// the call (a [`Criticality`] in the outgoing request's extensions) and the
/// [current](current()) one; either alone when the other is absent; `None` when neither is
/// set (the call then carries no level, and its server applies its default).
///
/// A caller may lower the level of a call, never raise it above its own request's: a
/// sheddable request's downstream calls stay sheddable whatever a handler asks.
///
/// ```
/// use overload_signal::criticality;
/// use overload_signal::protocol::Criticality;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// assert_eq!(criticality::outgoing(None), None);
/// assert_eq!(criticality::outgoing(Some(Criticality::CriticalPlus)), Some(Criticality::CriticalPlus));
/// let in_a_sheddable_request = criticality::scope(Criticality::Sheddable, async {
///     criticality::outgoing(Some(Criticality::CriticalPlus))
/// });
/// assert_eq!(in_a_sheddable_request.await, Some(Criticality::Sheddable));
/// # }
/// ```
pub fn outgoing(requested: Option<Criticality>) -> Option<Criticality> {
    match (requested, current()) {
        (Some(requested), Some(current)) => Some(requested.min(current)),
        (requested, current) => requested.or(current),
    }
}

/// Runs `future` with `level` as its current level, or the current one if that is lower:
/// an inner scope never raises an outer one.
///
/// [`CriticalityLayer`](super::CriticalityLayer) sets the level of each request around its
/// inner service; call this to give in-process work (a background job, a test) a level the
/// retry layer carries on the wire. The level follows the future, not the thread: a task it
/// spawns (`tokio::spawn`) is outside the scope.
pub fn scope<F: Future>(level: Criticality, future: F) -> CriticalityScope<F> {
    let level = current().map_or(level, |current| current.min(level));
    enter(Some(level), future)
}

/// Runs `f` (a service's `call`, which may read the current level before its future runs)
/// with exactly `level` as the current level.
pub(crate) fn call_with<R>(level: Option<Criticality>, f: impl FnOnce() -> R) -> R {
    CURRENT.sync_scope(level, f)
}

/// Runs `future` with exactly `level` as its current level.
pub(crate) fn enter<F: Future>(level: Option<Criticality>, future: F) -> CriticalityScope<F> {
    CURRENT.scope(level, future)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Criticality::{Critical, CriticalPlus, Sheddable, SheddablePlus};

    #[tokio::test]
    async fn scopes_nest_and_never_raise_the_outer_level() {
        let seen = scope(SheddablePlus, async {
            let raised = scope(CriticalPlus, async { current() }).await;
            let lowered = scope(Sheddable, async { current() }).await;
            (current(), raised, lowered)
        })
        .await;
        assert_eq!(
            seen,
            (Some(SheddablePlus), Some(SheddablePlus), Some(Sheddable))
        );
        assert_eq!(current(), None);
    }

    #[tokio::test]
    async fn a_call_carries_the_lower_of_its_own_level_and_its_requests() {
        scope(Critical, async {
            assert_eq!(outgoing(None), Some(Critical));
            assert_eq!(outgoing(Some(CriticalPlus)), Some(Critical));
            assert_eq!(outgoing(Some(Sheddable)), Some(Sheddable));
        })
        .await;
        assert_eq!(outgoing(Some(SheddablePlus)), Some(SheddablePlus));
    }

    #[tokio::test]
    async fn spawned_tasks_are_outside_the_scope() {
        let spawned = scope(Sheddable, async {
            tokio::spawn(async { current() }).await.unwrap()
        });
        assert_eq!(spawned.await, None);
    }
}
