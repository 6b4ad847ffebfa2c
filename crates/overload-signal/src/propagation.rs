//! Carrying what a downstream call ended with up through a server, without handler code.
//!
//! A server handler that calls a downstream service and gets the stop signal back must
//! answer its own caller with the stop signal too, or the tier above will retry and undo the
//! whole point. The client middleware knows when it has seen the signal; the server
//! middleware owns the response. This module connects them with a request-scoped marker,
//! which the server layer installs around its inner service with [`scope`] and the client
//! layer raises with [`mark_stop_received`]. Like a [task-local](tokio::task_local), the
//! marker is current on the thread only while the scoped future is being polled.
//!
//! The marker says more than the stop signal: `backoff-layer`'s retry layer also marks a
//! request that its client-side throttle refused to send, and one it gave up on
//! ([`mark_downstream`], [`Downstream`]). The overload layer reads the marks when its inner
//! service returns an **error**: in a server that is a proxy (a tower stack with a retry
//! layer over a hyper client, behind the overload layer), the retry layer's `Overloaded`,
//! `Throttled` or `GaveUp` is then answered as the protocol says (the stop signal, `503`,
//! `504` or `502`) instead of reaching the HTTP server as an error, which resets the
//! connection: the most retryable failure there is. The adaptive limit reads them too, to
//! leave out of its measurements what a downstream did.
//!
//! # Whose stop signals
//!
//! Every stop signal a retry layer receives is passed up by default: marked here, and, in a
//! gateway whose handler hands the downstream's answer back as it came, carried in that
//! answer too. That is right inside one organisation, whose services judge overload by the
//! same rule. A downstream you do not run (a third party's API) could otherwise make this
//! server tell all its callers to stop: `backoff-layer`'s `StopSignals::HonourOnly`, set on
//! the retry layer in front of it, honours its signal (no retry) without marking it here,
//! and takes it out of the answer the handler gets.
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

use crate::protocol::Criticality;

/// The marker of the scope being polled on this thread: `OUTSIDE` when none, else
/// `IN_SCOPE` and the marks raised so far; and, in its top bits, the
/// [criticality](crate::criticality) of the request served there (see [`scope_at`]).
const OUTSIDE: u8 = 0;
const IN_SCOPE: u8 = 1;
/// The bits of the marks ([`Downstream::bit`]).
const MARKS: u8 = 0b0001_1110;
/// The bits of the level: 0 for none, else its rank plus one.
const LEVEL_SHIFT: u32 = 5;
const LEVEL: u8 = 0b1110_0000;

/// The level bits of `level`.
#[allow(clippy::cast_possible_truncation)] // a rank is at most 3
const fn level_bits(level: Option<Criticality>) -> u8 {
    match level {
        Some(level) => ((level.rank() + 1) as u8) << LEVEL_SHIFT,
        None => 0,
    }
}

// NOTE: a thread-local with a constant initializer, swapped in for the duration of each poll
// of a `Scoped` future, as `tokio::task_local!` does, minus what this flag does not need (a
// `RefCell`, an `Option`, a lazily initialized slot): the overload layer installs a scope
// around every request it serves, so the swap is on every poll of every request.
thread_local! {
    static MARKER: Cell<u8> = const { Cell::new(OUTSIDE) };
}

/// What a downstream call made inside a request's scope ended with, besides an answer:
/// one mark of [`Marks`].
///
/// Non-exhaustive: a mark may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Downstream {
    /// A downstream answered with the stop signal, or a retry layer spent its retry budget
    /// (the paper's retry storm: the tier above is told to stop too, so that retries do not
    /// multiply from tier to tier).
    StopSignal,
    /// A client-side throttle refused to send a call: its destination keeps failing.
    Throttled,
    /// A retry layer gave up on a call (its attempts, its budget, a server's hint too long).
    GaveUp,
    /// A call ran out of its deadline (the caller's, or the retry layer's).
    DeadlineExceeded,
}

impl Downstream {
    const fn bit(self) -> u8 {
        match self {
            Self::StopSignal => 1 << 1,
            Self::Throttled => 1 << 2,
            Self::GaveUp => 1 << 3,
            Self::DeadlineExceeded => 1 << 4,
        }
    }
}

/// The marks raised in a request's scope: what its downstream calls ended with. Empty for a
/// request whose calls all had answers (or that made none).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Marks(u8);

impl Marks {
    /// The stop-signal mark alone.
    pub(crate) const fn stop() -> Self {
        Self(Downstream::StopSignal.bit())
    }

    /// Whether no mark was raised.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether `mark` was raised.
    pub const fn contains(self, mark: Downstream) -> bool {
        self.0 & mark.bit() != 0
    }

    /// Whether a downstream answered with the stop signal.
    pub const fn stop_signal(self) -> bool {
        self.contains(Downstream::StopSignal)
    }
}

impl fmt::Debug for Marks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all = [
            Downstream::StopSignal,
            Downstream::Throttled,
            Downstream::GaveUp,
            Downstream::DeadlineExceeded,
        ];
        f.debug_set()
            .entries(all.into_iter().filter(|&m| self.contains(m)))
            .finish()
    }
}

pin_project! {
    /// A future running inside a downstream-marker scope; see [`scope`].
    ///
    /// While it is polled, [`mark_downstream`] (and [`mark_stop_received`]) raise its marks
    /// and [`in_scope_marks`] reads them; [`take_marks`] (and [`stop_received`]) read them
    /// once it has completed.
    pub struct Scoped<F> {
        #[pin]
        future: F,
        marks: u8,
        // The level bits the scope sets (0: it keeps the enclosing scope's).
        level: u8,
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    // NOTE: inline, as it was before the marks (a bool, then): the swap is a few
    // instructions around the inner poll, run on every poll of every request.
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let outer = MARKER.get();
        // NOTE: a scope without a level of its own keeps the enclosing one's, so that a
        // service of the handler's own with an overload layer of its own does not hide it.
        let level = if *this.level == 0 {
            outer & LEVEL
        } else {
            *this.level
        };
        MARKER.set(IN_SCOPE | *this.marks | level);
        let outer = Restore(outer);
        let output = this.future.poll(cx);
        *this.marks = MARKER.get() & MARKS;
        // The enclosing scope's marker (or none) is put back here, and on a panic too.
        drop(outer);
        output
    }
}

impl<F> fmt::Debug for Scoped<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scoped")
            .field("marks", &Marks(self.marks))
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

/// Runs `future` with fresh, lowered marks.
///
/// Scopes nest: an inner scope hides the outer one while it runs.
pub const fn scope<F: Future>(future: F) -> Scoped<F> {
    Scoped {
        future,
        marks: 0,
        level: 0,
    }
}

/// [`scope`], in which [`criticality::current`](crate::criticality::current) is `level`
/// too (the lower of it and the level of an enclosing
/// [`criticality::scope`](crate::criticality::scope)), or that of the enclosing scope when
/// `level` is `None`.
///
/// The overload layer serves each request in it when it resolves the request's level: one
/// scope, one swap of one thread-local per poll, for the downstream marker and the level.
pub(crate) const fn scope_at<F: Future>(future: F, level: Option<Criticality>) -> Scoped<F> {
    Scoped {
        future,
        marks: 0,
        level: level_bits(level),
    }
}

/// Runs `f` (a service's `call`, which may read the current level before its future runs)
/// with `level` as the level of [`scope_at`]; the marker is otherwise left as it is.
#[inline]
pub(crate) fn call_at<R>(level: Criticality, f: impl FnOnce() -> R) -> R {
    /// Puts back the enclosing level when dropped (on a panic too), and keeps the marks
    /// raised meanwhile: `f` ran in the enclosing scope.
    struct RestoreLevel(u8);
    impl Drop for RestoreLevel {
        fn drop(&mut self) {
            MARKER.set((MARKER.get() & !LEVEL) | self.0);
        }
    }
    let marker = MARKER.get();
    let _restore = RestoreLevel(marker & LEVEL);
    MARKER.set((marker & !LEVEL) | level_bits(Some(level)));
    f()
}

/// The level the [`scope_at`] being polled on this thread set (or inherited); `None`
/// outside any, or in one without a level.
#[inline]
pub(crate) fn scoped_level() -> Option<Criticality> {
    match (MARKER.get() & LEVEL) >> LEVEL_SHIFT {
        0 => None,
        bits => Criticality::ALL.get(usize::from(bits) - 1).copied(),
    }
}

/// Raises `mark` in the scope the current task is running in. Returns `false` (and does
/// nothing) outside any scope.
pub fn mark_downstream(mark: Downstream) -> bool {
    let marker = MARKER.get();
    // NOTE: the flag, not the whole marker: `call_at` sets a level outside any scope.
    if marker & IN_SCOPE == OUTSIDE {
        return false;
    }
    MARKER.set(marker | mark.bit());
    true
}

/// Raises the stop-signal mark of the scope the current task is running in. Returns `false`
/// (and does nothing) outside any scope. The same as
/// `mark_downstream(Downstream::StopSignal)`.
pub fn mark_stop_received() -> bool {
    mark_downstream(Downstream::StopSignal)
}

/// The marks of the current scope so far, for code running inside the scope (empty outside
/// any scope).
pub fn in_scope_marks() -> Marks {
    Marks(MARKER.get() & MARKS)
}

/// Whether the stop-signal mark of the current scope is raised, for code running inside
/// the scope. `false` outside any scope.
pub fn in_scope_stop_received() -> bool {
    in_scope_marks().stop_signal()
}

/// The marks raised while `scoped` ran. Call it once the future has completed (polling it
/// again afterwards is a bug, as for any future). The marks are taken: a second call returns
/// none.
pub fn take_marks<F: Future>(scoped: Pin<&mut Scoped<F>>) -> Marks {
    Marks(std::mem::take(scoped.project().marks))
}

/// Whether the stop-signal mark of `scoped` was raised while it ran; see [`take_marks`],
/// which this calls (the marks are taken: a second call returns `false`).
pub fn stop_received<F: Future>(scoped: Pin<&mut Scoped<F>>) -> bool {
    take_marks(scoped).stop_signal()
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
    async fn every_mark_is_kept_and_read_apart() {
        let mut s = pin!(scope(async {
            assert!(mark_downstream(Downstream::Throttled));
            tokio::task::yield_now().await;
            assert!(mark_downstream(Downstream::DeadlineExceeded));
            in_scope_marks()
        }));
        let inside = s.as_mut().await;
        assert!(inside.contains(Downstream::Throttled));
        assert!(inside.contains(Downstream::DeadlineExceeded));
        assert!(!inside.stop_signal() && !inside.contains(Downstream::GaveUp));
        assert_eq!(format!("{inside:?}"), "{Throttled, DeadlineExceeded}");
        let taken = take_marks(s.as_mut());
        assert_eq!(taken, inside);
        assert!(take_marks(s.as_mut()).is_empty(), "taken once");
        assert!(!mark_downstream(Downstream::GaveUp), "outside any scope");
        assert!(in_scope_marks().is_empty());
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
