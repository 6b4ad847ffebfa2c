//! Carrying a downstream stop signal up through a server, without handler code.
//!
//! A server handler that calls a downstream service and gets the stop signal back must
//! answer its own caller with the stop signal too, or the tier above will retry and undo the
//! whole point. The client middleware knows when it has seen the signal; the server
//! middleware owns the response. This module connects them with a request-scoped marker,
//! which the server layer installs around its inner service with [`scope`] and the client
//! layer raises with [`mark_stop_received`]. Like a [task-local](tokio::task_local), the
//! marker is current on the thread only while the scoped future is being polled.
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
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

/// The marker of the scope being polled on this thread, if any.
const OUTSIDE: u8 = 0;
const LOWERED: u8 = 1;
const RAISED: u8 = 2;

// NOTE: a thread-local with a constant initializer, swapped in for the duration of each poll
// of a `Scoped` future, as `tokio::task_local!` does, minus what this flag does not need (a
// `RefCell`, an `Option`, a lazily initialized slot): the overload layer installs a scope
// around every request it serves, so the swap is on every poll of every request.
thread_local! {
    static MARKER: Cell<u8> = const { Cell::new(OUTSIDE) };
}

pin_project! {
    /// A future running inside a stop-signal scope; see [`scope`].
    ///
    /// While it is polled, [`mark_stop_received`] raises its marker and
    /// [`in_scope_stop_received`] reads it; [`stop_received`] reads it once it has completed.
    pub struct Scoped<F> {
        #[pin]
        future: F,
        raised: bool,
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let outer = Restore(MARKER.replace(if *this.raised { RAISED } else { LOWERED }));
        let output = this.future.poll(cx);
        *this.raised = MARKER.get() == RAISED;
        // The enclosing scope's marker (or none) is put back here, and on a panic too.
        drop(outer);
        output
    }
}

impl<F> fmt::Debug for Scoped<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scoped")
            .field("raised", &self.raised)
            .finish_non_exhaustive()
    }
}

/// Puts back the marker of the enclosing scope when dropped.
struct Restore(u8);

impl Drop for Restore {
    fn drop(&mut self) {
        MARKER.set(self.0);
    }
}

/// Runs `future` with a fresh, lowered stop marker.
///
/// Scopes nest: an inner scope hides the outer one while it runs.
pub const fn scope<F: Future>(future: F) -> Scoped<F> {
    Scoped {
        future,
        raised: false,
    }
}

/// Raises the marker of the scope the current task is running in. Returns `false` (and does
/// nothing) outside any scope.
pub fn mark_stop_received() -> bool {
    if MARKER.get() == OUTSIDE {
        return false;
    }
    MARKER.set(RAISED);
    true
}

/// Whether the marker of the current scope is raised, for code running inside the scope.
/// `false` outside any scope.
pub fn in_scope_stop_received() -> bool {
    MARKER.get() == RAISED
}

/// Whether the marker of `scoped` was raised while it ran. Call it once the future has
/// completed (polling it again afterwards is a bug, as for any future). The marker is taken:
/// a second call returns `false`.
pub fn stop_received<F: Future>(scoped: Pin<&mut Scoped<F>>) -> bool {
    std::mem::take(scoped.project().raised)
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
    async fn an_inner_scope_leaves_a_raised_outer_marker_raised() {
        let mut outer = pin!(scope(async {
            assert!(mark_stop_received());
            let mut inner = pin!(scope(async { in_scope_stop_received() }));
            assert!(!inner.as_mut().await, "the inner scope starts lowered");
            in_scope_stop_received()
        }));
        assert!(outer.as_mut().await);
        assert!(stop_received(outer.as_mut()));
        assert!(!stop_received(outer.as_mut()), "the marker is taken");
        assert!(
            !mark_stop_received(),
            "nothing is left current after the scope"
        );
    }

    #[test]
    fn a_panicking_future_leaves_no_scope_behind() {
        let outcome = std::panic::catch_unwind(|| {
            let waker = std::task::Waker::noop();
            let mut cx = Context::from_waker(waker);
            let mut s = pin!(scope(async {
                mark_stop_received();
                panic!("the handler panics");
            }));
            let _ = s.as_mut().poll(&mut cx);
        });
        assert!(outcome.is_err());
        assert!(
            !mark_stop_received(),
            "the panic must not leave the scope current"
        );
        assert!(!in_scope_stop_received());
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
