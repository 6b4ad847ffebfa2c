//! A header value as a key: [`HeaderKey`].

use std::borrow::Cow;
use std::hash::Hasher;

use http::HeaderName;
use http::request::Parts;
use overload_signal::signal::CallerKey;
use sha2::{Digest, Sha256};

use super::extractor::{KeyExtractor, MissingKey};

/// A key extractor: the value of one request header (the first line, as bytes), such as an
/// API key, a bearer token or a tenant id.
///
/// A value of up to [`MAX_LEN`](Self::MAX_LEN) bytes (256) is the key as it came. A longer
/// one (a JWT is 500 to 1 500 bytes) is keyed by its SHA-256 digest: a NUL byte (which no
/// header value holds, so it never names a short value's key) followed by the digest's 32
/// bytes. So every key holds at most 256 bytes, whatever a client sends; the same value is
/// the same key in every process of a fleet (the digest has no per-process seed, as a limit
/// kept in Redis needs); and two different values share a key only if SHA-256 collides.
/// Hashing costs a few microseconds for a value of a few kilobytes (the server's header
/// size limit bounds it), and a 33-byte copy per request; a short value is looked up in
/// place.
///
/// A request without the header has no key; by default such requests share one limit
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
    /// The longest header value used as a key as it came: 256 bytes, this crate's choice,
    /// above the length of common API keys and tokens' identifiers while bounding what one
    /// key holds. A longer value is keyed by its SHA-256 digest (33 bytes).
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
        Some(if value.len() <= Self::MAX_LEN {
            Cow::Borrowed(value)
        } else {
            Cow::Owned(digest_key(value))
        })
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

/// The key of a value longer than [`HeaderKey::MAX_LEN`]: a NUL byte, then the value's
/// SHA-256 digest.
#[cold]
pub(super) fn digest_key(value: &[u8]) -> Vec<u8> {
    // NOTE: the NUL byte keeps the 33 bytes from ever equalling a short value's key: an
    // `http::HeaderValue` never holds one. SHA-256, not a keyed hash: every process of a
    // fleet must name the same value alike, and no secret is needed against collisions.
    let mut key = Vec::with_capacity(1 + 32);
    key.push(0);
    key.extend_from_slice(&Sha256::digest(value));
    key
}
