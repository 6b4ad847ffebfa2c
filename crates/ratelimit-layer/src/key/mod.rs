//! Which key a request is limited under: the client's IP address ([`ClientIp`]), a header
//! value ([`HeaderKey`]), or anything a closure or a [`KeyExtractor`] of your own extracts.
//!
//! Extractors see the request head ([`Parts`]) and return `None` when the request has no
//! key; what happens to such a request is the layer's [`MissingKey`] policy: a `500`, one
//! shared limit ([`KeyClass::Unkeyed`](crate::keyed::KeyClass)), or no limit. The first such
//! request is logged, whatever the policy: at `ERROR` with the fix for a [`ClientIp`] (the
//! server does not put the peer address in its requests), at `WARN` otherwise.
//!
//! The built-in extractors also implement `overload-signal`'s [`CallerKey`], so the overload
//! layer can tell callers apart by the same key as the limit.
//!
//! [`CallerKey`]: https://docs.rs/overload-signal/0.1/overload_signal/signal/trait.CallerKey.html
//!
//! The built-in extractors allocate nothing per request: an IP address is a value, and a
//! header value is looked up borrowed from the request; only a key seen for the first time
//! is copied into the limiter's map.
//!
//! [`Parts`]: https://docs.rs/http/1/http/request/struct.Parts.html

mod client_ip;
mod extractor;
mod header;
#[cfg(test)]
mod tests;

pub use client_ip::{ClientIp, ClientIpBuilder};
pub use extractor::{KeyExtractor, MissingKey, NoKey};
pub use header::HeaderKey;
// NOTE: defined in `overload-signal`, which the overload layer's own proxy setting needs;
// re-exported here so `ratelimit_layer::key::{ForwardedHeader, IpNet}` keep working.
pub use overload_signal::signal::{ForwardedHeader, IpNet, TrustedProxies};
