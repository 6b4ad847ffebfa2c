//! Carrying a downstream stop signal up through a server, without handler code.
//!
//! A server handler that calls a downstream service and gets the stop signal back must
//! answer its own caller with the stop signal too, or the tier above will retry and undo the
//! whole point. The client middleware knows when it has seen the signal; the server
//! middleware owns the response. This module connects them with a request-scoped marker: a
//! [task-local](tokio::task_local) flag that the server layer installs around its inner
//! service with [`scope`] and that the client layer raises with [`mark_stop_received`].
//!
//! # Limits
//!
//! The marker follows the request's future, not threads or tasks: a downstream call made
//! from a task the handler spawns (`tokio::spawn`) is outside the scope, and its stop signal
//! is not seen here. Return the [`Overloaded`](crate::Overloaded) error from such calls
//! instead, and map it to the stop signal in the handler.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::pin::pin;
//! use overload_signal::propagation::{mark_stop_received, scope, stop_received};
//!
//! // What a client layer does when a response carries the stop signal:
//! let handler = async {
//!     assert!(mark_stop_received(), "we are inside a server's scope");
//!     "response"
//! };
//! // What the server layer does around its inner service:
//! let mut scoped = pin!(scope(handler));
//! let response = scoped.as_mut().await;
//! assert_eq!(response, "response");
//! assert!(stop_received(scoped.as_mut()));
//!
//! // Outside any scope, marking is a no-op.
//! assert!(!mark_stop_received());
//! # }
//! ```

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;

use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static STOP_RECEIVED: Cell<bool>;
}

/// A future running inside a stop-signal scope; see [`scope`].
pub type Scoped<F> = TaskLocalFuture<Cell<bool>, F>;

/// Runs `future` with a fresh, lowered stop marker.
///
/// Scopes nest: an inner scope hides the outer one while it runs.
pub fn scope<F: Future>(future: F) -> Scoped<F> {
    STOP_RECEIVED.scope(Cell::new(false), future)
}

/// Raises the marker of the scope the current task is running in. Returns `false` (and does
/// nothing) outside any scope.
pub fn mark_stop_received() -> bool {
    STOP_RECEIVED.try_with(|m| m.set(true)).is_ok()
}

/// Whether the marker of the current scope is raised, for code running inside the scope.
/// `false` outside any scope.
pub fn in_scope_stop_received() -> bool {
    STOP_RECEIVED.try_with(Cell::get).unwrap_or(false)
}

/// Whether the marker of `scoped` was raised while it ran. Call it once the future has
/// completed (polling it again afterwards is a bug, as for any future).
pub fn stop_received<F: Future>(scoped: Pin<&mut Scoped<F>>) -> bool {
    scoped.take_value().is_some_and(|m| m.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;

    #[tokio::test]
    async fn untouched_scope_is_lowered() {
        let mut s = pin!(scope(async { in_scope_stop_received() }));
        assert!(!s.as_mut().await);
        assert!(!stop_received(s.as_mut()));
    }

    #[tokio::test]
    async fn marker_survives_awaits_inside_the_scope() {
        let mut s = pin!(scope(async {
            tokio::task::yield_now().await;
            assert!(mark_stop_received());
            tokio::task::yield_now().await;
            in_scope_stop_received()
        }));
        assert!(s.as_mut().await);
        assert!(stop_received(s.as_mut()));
    }

    #[tokio::test]
    async fn scopes_nest_and_do_not_leak_outwards() {
        let mut outer = pin!(scope(async {
            let mut inner = pin!(scope(async { mark_stop_received() }));
            assert!(inner.as_mut().await);
            assert!(stop_received(inner.as_mut()));
            in_scope_stop_received()
        }));
        assert!(
            !outer.as_mut().await,
            "inner mark must not raise the outer scope"
        );
        assert!(!stop_received(outer.as_mut()));
    }

    #[tokio::test]
    async fn spawned_tasks_are_outside_the_scope() {
        let mut s = pin!(scope(async {
            tokio::spawn(async { mark_stop_received() }).await.unwrap()
        }));
        assert!(!s.as_mut().await);
        assert!(!stop_received(s.as_mut()));
    }
}
