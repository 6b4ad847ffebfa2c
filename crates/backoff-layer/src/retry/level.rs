//! The level of criticality a request's attempts carry on the wire: resolved once per
//! request, written on every attempt. A leaf: the service and its future both use it.

use overload_signal::criticality;
use overload_signal::protocol::{Criticality, X_REQUEST_CRITICALITY};

/// The level a request's attempts carry downstream: the one its caller asked for (a
/// [`Criticality`] in its extensions, or else an `X-Request-Criticality` written by hand),
/// never above the level of the request being served ([`criticality::outgoing`]); `None`
/// when there is neither.
///
/// NOTE: a hand-written header that carries no level (junk, or two levels) is removed: the
/// layer writes a level it resolved or none, so a server never counts it as malformed.
#[inline]
pub(super) fn outgoing_level(parts: &mut http::request::Parts) -> Option<Criticality> {
    let requested = match parts.extensions.get::<Criticality>() {
        Some(level) => Some(*level),
        // NOTE: no look-up at all on a request without headers.
        None if !parts.headers.is_empty() && parts.headers.contains_key(X_REQUEST_CRITICALITY) => {
            let claimed = Criticality::from_headers(&parts.headers);
            if claimed.is_none() {
                parts.headers.remove(X_REQUEST_CRITICALITY);
            }
            claimed
        }
        None => None,
    };
    criticality::outgoing(requested)
}

/// Writes `level` in an attempt's `X-Request-Criticality` (replacing any value), or nothing.
#[inline]
pub(super) fn set_level(headers: &mut http::HeaderMap, level: Option<Criticality>) {
    if let Some(level) = level {
        headers.insert(X_REQUEST_CRITICALITY, level.header_value());
    }
}
