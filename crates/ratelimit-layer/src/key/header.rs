//! A header value as a key: [`HeaderKey`].

use std::borrow::Cow;
use std::hash::Hasher;

use http::HeaderName;
use http::request::Parts;
use overload_signal::signal::CallerKey;

use super::extractor::{KeyExtractor, MissingKey};

/// A key extractor: the value of one request header (the first line, as bytes), such as an
/// API key or a tenant id.
///
/// A request without the header, or with a value longer than [`MAX_LEN`](Self::MAX_LEN),
/// has no key, so a long value cannot grow memory; by default such requests share one limit
/// ([`MissingKey::Shared`]: a client may send no key).
///
/// A request is looked up by the header's bytes in place, without allocating; the value is
/// copied into the map only the first time it is seen, and not kept as a
/// [`http::HeaderValue`], which may share (and so keep alive) the whole buffer the request
/// head was read into.
///
/// [`http::HeaderValue`]: https://docs.rs/http/1/http/header/struct.HeaderValue.html
///
/// ```
/// use http::HeaderName;
/// use ratelimit_layer::{RateLimitLayer, TokenBucket};
/// use ratelimit_layer::key::HeaderKey;
///
/// let layer = RateLimitLayer::builder(TokenBucket::new(10)?)
///     .key_by(HeaderKey::new(HeaderName::from_static("x-api-key")))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// The longest header value used as a key: 256 bytes, this crate's choice, above the
    /// length of common API keys and tokens' identifiers while bounding what one key holds.
    pub const MAX_LEN: usize = 256;

    /// Keys requests by the value of header `name`.
    pub const fn new(name: HeaderName) -> Self {
        Self { name }
    }

    /// The header's name.
    pub const fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl KeyExtractor for HeaderKey {
    type Key = Box<[u8]>;
    type Lookup = [u8];

    #[inline]
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Cow<'a, [u8]>> {
        let value = parts.headers.get(&self.name)?.as_bytes();
        (value.len() <= Self::MAX_LEN).then_some(Cow::Borrowed(value))
    }

    /// [`MissingKey::Shared`]: a request without the header is an anonymous client, which
    /// the client decides; a `500` would let any client make the server report an error.
    fn missing_key(&self) -> MissingKey {
        MissingKey::Shared
    }
}

/// The overload layer tells callers apart by the header's value. A client chooses it, so
/// unless it is authenticated before this layer, one client can appear as many: see
/// [`CallerKey`](https://docs.rs/overload-signal/0.1/overload_signal/signal/trait.CallerKey.html).
impl CallerKey for HeaderKey {
    fn hash_key(&self, parts: &Parts, state: &mut dyn Hasher) -> bool {
        match self.extract(parts) {
            Some(value) => {
                state.write(&value);
                true
            }
            None => false,
        }
    }
}
