//! The wait a server asks for before a retry: `Retry-After`, or gRPC's
//! `grpc-retry-pushback-ms`.

use std::time::{Duration, SystemTime};

use http::HeaderMap;
use overload_signal::protocol::{self, GrpcPushback};

/// The wait a server asked for, and whether a gRPC pushback asked for it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ServerHint {
    /// How long the server asked the client to wait.
    pub(crate) wait: Duration,
    /// Whether `grpc-retry-pushback-ms` asked for it (the backoff then starts over).
    pub(crate) pushback: bool,
}

/// A server's `Retry-After` or (non-negative) `grpc-retry-pushback-ms`, whichever is longer.
pub(crate) fn server_hint(headers: &HeaderMap) -> Option<ServerHint> {
    let retry_after = protocol::retry_after(headers, SystemTime::now());
    let pushback = match protocol::grpc_pushback(headers) {
        Some(GrpcPushback::Delay(d)) => Some(d),
        _ => None,
    };
    match (retry_after, pushback) {
        (Some(r), Some(p)) if r > p => Some(ServerHint {
            wait: r,
            pushback: false,
        }),
        (_, Some(p)) => Some(ServerHint {
            wait: p,
            pushback: true,
        }),
        (Some(r), None) => Some(ServerHint {
            wait: r,
            pushback: false,
        }),
        (None, None) => None,
    }
}
