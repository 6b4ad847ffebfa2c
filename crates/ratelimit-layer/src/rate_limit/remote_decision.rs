//! Decisions made elsewhere (in Redis, for a fleet): what a [`Remote`](crate::Remote) rate
//! limit awaits before it calls the inner service.
//!
//! A local limiter decides in `call`, synchronously. A remote one answers after a network
//! round trip, so its decision is a future that the response future polls first
//! ([`RemoteResponseFuture`](crate::future::RemoteResponseFuture)). The hook is
//! [`RemoteDecide`], which `crate::redis` implements; this module knows nothing of Redis.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::request::Parts;

use crate::algorithm::{Decision, QuotaStatus};
use crate::keyed::KeyClass;

/// A limiter whose decisions are made elsewhere, type-erased.
///
/// The layer's own local decision stays in place next to it as the fallback: a request the
/// remote will not decide (`start` returns `None`), or could not decide (its future answers
/// [`RemoteFallback`]), is decided locally.
pub(crate) trait RemoteDecide: Send + Sync + 'static {
    /// Starts deciding a request of `cost`: a decision under way elsewhere, one made
    /// already from what the process holds (a local reservation of the remote limit), or
    /// [`RemoteStart::Local`] when the local limiter must decide at once (the remote is
    /// known to be away, or asking it is pointless: a free request, or one above the
    /// limiter's capacity).
    fn start(&self, parts: &Parts, cost: u32) -> RemoteStart;

    /// The layer's first request: registers the remote's metrics and starts what keeps
    /// them true while no request comes.
    fn first_request(&self);
}

/// How a remote decision starts.
pub(crate) enum RemoteStart {
    /// Under way: the response future awaits it.
    Pending(RemoteDecision),
    /// Made at once, for the remote limit, without a round trip.
    Decided(Decision, QuotaStatus, KeyClass),
    /// Left to the local limiter.
    Local,
}

/// The remote could not decide; the layer decides locally instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RemoteFallback;

/// What a remote decision yields: the decision, what is left of the quota, and the class of
/// limit it was taken against; or [`RemoteFallback`].
pub(crate) type RemoteOutcome = Result<(Decision, QuotaStatus, KeyClass), RemoteFallback>;

type BoxedDecision = Pin<Box<dyn Future<Output = RemoteOutcome> + Send + 'static>>;

/// A decision under way elsewhere.
///
/// The client library's requests borrow its connection, so the owned future that a
/// response future can hold is boxed: one allocation per remote decision, next to the
/// client's own (command buffers, reply values), and none on a local limiter's path.
pub(crate) struct RemoteDecision {
    future: BoxedDecision,
}

impl RemoteDecision {
    pub(crate) fn new<F>(future: F) -> Self
    where
        F: Future<Output = RemoteOutcome> + Send + 'static,
    {
        Self {
            future: Box::pin(future),
        }
    }

    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<RemoteOutcome> {
        self.future.as_mut().poll(cx)
    }
}

impl fmt::Debug for RemoteDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteDecision").finish_non_exhaustive()
    }
}
