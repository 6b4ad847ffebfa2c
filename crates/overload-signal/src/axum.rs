//! `IntoResponse` for [`Overloaded`], behind the `axum` feature.

use axum::response::{IntoResponse, Response};

use crate::Overloaded;
use crate::protocol::{Protocol, stop_signal_response};

/// A handler that returns `Err(Overloaded)` answers with the HTTP stop signal: `503
/// Service Unavailable`, `X-Overloaded: stop-retrying`, empty body.
///
/// ```
/// use axum::response::IntoResponse;
/// use overload_signal::{Overloaded, protocol};
///
/// // In a handler: `async fn h() -> Result<String, Overloaded> { call_next_tier().await }`
/// let response = Overloaded::new().into_response();
/// assert_eq!(response.status(), 503);
/// assert!(protocol::is_stop_signal(response.headers()));
/// ```
impl IntoResponse for Overloaded {
    fn into_response(self) -> Response {
        stop_signal_response(Protocol::Http)
    }
}
