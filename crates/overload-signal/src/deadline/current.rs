//! The deadline of the request a task is serving: a task-local that a server layer sets and
//! a client layer reads, so that a handler's downstream calls inherit what is left of it.

use std::future::Future;
use std::time::Duration;

use tokio::task::futures::TaskLocalFuture;

use super::value::RequestDeadline;

tokio::task_local! {
    static CURRENT: Option<RequestDeadline>;
}

/// A future running with a current deadline; see [`scope`].
pub type DeadlineScope<F> = TaskLocalFuture<Option<RequestDeadline>, F>;

/// The deadline of the request the current task is serving: the one
/// [`DeadlineLayer`](super::DeadlineLayer) (or [`scope`]) set around the code running now;
/// `None` outside any, or when the request has none.
///
/// `backoff-layer`'s retry layer reads it on every call, so that a handler calling a
/// downstream service through it passes on what is left of its own deadline, without code.
pub fn current() -> Option<RequestDeadline> {
    CURRENT.try_with(|deadline| *deadline).ok().flatten()
}

/// The time left until the [current](current()) deadline: `Some(Duration::ZERO)` once it
/// has passed, `None` without one. A handler reads it to decide how much work is worth
/// starting.
///
/// ```
/// use std::time::Duration;
/// use overload_signal::deadline::{self, RequestDeadline};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let handler = async {
///     match deadline::time_left() {
///         Some(left) if left < Duration::from_millis(100) => "too late for the full answer",
///         _ => "the full answer",
///     }
/// };
/// let two_seconds = RequestDeadline::after(Duration::from_secs(2));
/// assert_eq!(deadline::scope(Some(two_seconds), handler).await, "the full answer");
/// assert_eq!(deadline::time_left(), None, "outside any scope");
/// # }
/// ```
pub fn time_left() -> Option<Duration> {
    current().map(RequestDeadline::time_left)
}

/// Runs `future` with `deadline` as its current deadline, or the current one if that is
/// earlier: an inner scope never extends an outer one.
///
/// [`DeadlineLayer`](super::DeadlineLayer) does this around its inner service; call it to
/// give in-process work (a background job, a test) a deadline the retry layer honours.
///
/// The deadline follows the future, not the thread: a task the future spawns
/// (`tokio::spawn`) is outside the scope. Pass the [`RequestDeadline`] to such a task, and put
/// it in the extensions of the requests it sends.
pub fn scope<F: Future>(deadline: Option<RequestDeadline>, future: F) -> DeadlineScope<F> {
    enter(RequestDeadline::earliest(deadline, current()), future)
}

/// Runs `f` (a service's `call`, which may read the current deadline before its future
/// runs: a retry layer right under the deadline layer does) with exactly `deadline` as the
/// current deadline.
pub(super) fn call_with<R>(deadline: Option<RequestDeadline>, f: impl FnOnce() -> R) -> R {
    CURRENT.sync_scope(deadline, f)
}

/// Runs `future` with exactly `deadline` as its current deadline.
pub(super) fn enter<F: Future>(deadline: Option<RequestDeadline>, future: F) -> DeadlineScope<F> {
    CURRENT.scope(deadline, future)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn scopes_nest_and_never_extend_the_outer_deadline() {
        let soon = RequestDeadline::after(Duration::from_secs(1));
        let later = RequestDeadline::after(Duration::from_secs(5));
        let seen = scope(Some(soon), async {
            assert_eq!(current(), Some(soon));
            let inner = scope(Some(later), async { current() }).await;
            let open = scope(None, async { current() }).await;
            (inner, open)
        })
        .await;
        assert_eq!(seen, (Some(soon), Some(soon)));
        let tighter = scope(Some(later), async {
            scope(Some(soon), async { current() }).await
        });
        assert_eq!(tighter.await, Some(soon));
        assert_eq!(current(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn time_left_runs_down_and_stops_at_zero() {
        let deadline = RequestDeadline::after(Duration::from_secs(1));
        scope(Some(deadline), async {
            assert_eq!(time_left(), Some(Duration::from_secs(1)));
            tokio::time::sleep(Duration::from_millis(400)).await;
            assert_eq!(time_left(), Some(Duration::from_millis(600)));
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(time_left(), Some(Duration::ZERO));
            assert!(deadline.has_passed());
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn spawned_tasks_are_outside_the_scope() {
        let deadline = RequestDeadline::after(Duration::from_secs(1));
        let spawned = scope(Some(deadline), async {
            tokio::spawn(async { current() }).await.unwrap()
        });
        assert_eq!(spawned.await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_too_long_to_represent_is_the_far_future() {
        let deadline = RequestDeadline::after(Duration::MAX);
        assert!(deadline.time_left() > Duration::from_secs(86_400 * 365 * 29));
    }
}
