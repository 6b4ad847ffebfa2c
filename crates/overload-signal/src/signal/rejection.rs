//! Whom a rejection concerns: what a limiter tells the layer about its rejection.

/// Whom a rejection concerns: the limiter that rejects says so in the response's extensions,
/// and the [`OverloadSignalLayer`](super::OverloadSignalLayer) judges the rejection
/// accordingly.
///
/// - [`Server`](Self::Server) (also what a rejection without this extension is): the server
///   as a whole is over its limit (a global rate limit, a load shedder, an adaptive
///   concurrency limit). The layer judges the whole server's window, with each caller
///   class's weight bounded, and answers with the stop signal when the fleet is drowning in
///   retries.
/// - [`Caller`](Self::Caller): the rejected caller is over its own limit (a keyed rate limit
///   rejecting one client IP, API key or tenant). The server is not overloaded, and other
///   callers' retries say nothing about this one, so the layer judges only the rejected
///   caller's own class: the stop signal when that caller is the one drowning the server in
///   retries, the plain rejection otherwise.
///
/// `ratelimit-layer` marks its keyed rejections `Caller`; a limiter of your own inserts the
/// extension in the rejection it returns:
///
/// ```
/// use http::{Response, StatusCode};
/// use overload_signal::signal::RejectionScope;
///
/// let mut rejection = Response::new(());
/// *rejection.status_mut() = StatusCode::TOO_MANY_REQUESTS;
/// rejection.extensions_mut().insert(RejectionScope::Caller);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RejectionScope {
    /// The server as a whole is over its limit. The default.
    #[default]
    Server = 0,
    /// The rejected caller is over its own limit.
    Caller = 1,
}

impl RejectionScope {
    /// The `scope` label of the layer's metrics: `server` or `caller`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Caller => "caller",
        }
    }
}
