//! What a key extractor is ([`KeyExtractor`]), what happens to a request without a key
//! ([`MissingKey`]), and the extractor of a layer without keys ([`NoKey`]).

use std::borrow::{Borrow, Cow};
use std::hash::Hash;
use std::net::IpAddr;

use http::request::Parts;
use overload_signal::signal::client_addr;

/// What a keyed limit does with a request from which its extractor gets no key, chosen when
/// the layer is built ([`RateLimitBuilder::missing_key`](crate::RateLimitBuilder::missing_key)).
///
/// Whichever it is, the first such request is logged (then at most once a minute while they
/// keep coming: at `ERROR`, with the fix, for a [`ClientIp`](super::ClientIp), whose key is
/// missing only when the server does not put the peer address in its requests; at `WARN`
/// otherwise), and the counter `ratelimit_layer_missing_key_total` counts them all, so a key
/// that is missing by mistake is never silent.
///
/// Default: the extractor's ([`KeyExtractor::missing_key`]): [`Reject`](Self::Reject) for
/// [`ClientIp`](super::ClientIp) and closures, [`Shared`](Self::Shared) for
/// [`HeaderKey`](super::HeaderKey).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MissingKey {
    /// Answer `500 Internal Server Error` (for gRPC, `grpc-status: 13`, `INTERNAL`) without
    /// calling the inner service: the key is missing because the server is not set up to
    /// provide it (a server that does not put the peer address in its requests, an
    /// authentication layer placed after the limit). Fails loudly, as `tower_governor` does,
    /// rather than limit every client as one.
    Reject,
    /// Limit every request without a key together, as one more key
    /// ([`KeyClass::Unkeyed`](crate::keyed::KeyClass::Unkeyed)): for keys a client may
    /// legitimately lack, such as an optional API key, where anonymous clients share one
    /// quota.
    Shared,
    /// Admit every request without a key, unlimited: for keys only some traffic has, where
    /// the rest is limited elsewhere.
    Bypass,
}

impl MissingKey {
    /// The `action` label of `ratelimit_layer_missing_key_total`: `reject`, `shared` or
    /// `bypass`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::Shared => "shared",
            Self::Bypass => "bypass",
        }
    }
}

/// Extracts the key a request is limited under.
///
/// A keyed limit stores one [`Key`](Self::Key) per client, and looks a request up by a
/// [`Lookup`](Self::Lookup), which [`extract`](Self::extract) may borrow from the request so
/// that a known key costs no allocation: [`HeaderKey`](super::HeaderKey) stores `Box<[u8]>`
/// and looks up the header's bytes in place. The two must hash and compare alike, as
/// [`Borrow`] requires.
///
/// Why it is not `overload-signal`'s `CallerKey`, which the built-in extractors implement
/// too: a limit stores state per key, so this trait needs an owned, comparable key, a
/// borrowed lookup and a missing-key policy, where the overload layer only hashes a key into
/// a class and forgets it (`CallerKey`'s docs say more).
///
/// Implemented by [`ClientIp`](super::ClientIp), [`HeaderKey`](super::HeaderKey), and every
/// closure `Fn(&Parts) -> Option<K>` whose key `K` is `Hash + Eq + Clone + Send + Sync`. A closure
/// passed to [`RateLimitBuilder::key_by`](crate::RateLimitBuilder::key_by) needs its
/// argument's type written out (`|parts: &Parts| ...`), because the compiler infers a
/// closure's signature only from an `Fn` bound.
///
/// A key extractor of your own, borrowing a tenant name from a request extension:
///
/// ```
/// use std::borrow::Cow;
/// use http::request::Parts;
/// use ratelimit_layer::key::KeyExtractor;
///
/// /// Put in the request's extensions by an authentication layer.
/// #[derive(Clone)]
/// struct Tenant(String);
///
/// struct ByTenant;
///
/// impl KeyExtractor for ByTenant {
///     type Key = Box<str>;
///     type Lookup = str;
///
///     fn extract<'a>(&self, parts: &'a Parts) -> Option<Cow<'a, str>> {
///         let tenant = parts.extensions.get::<Tenant>()?;
///         Some(Cow::Borrowed(tenant.0.as_str()))
///     }
/// }
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key as the limiter stores it.
    type Key: Borrow<Self::Lookup> + Hash + Eq + Send + Sync + 'static;

    /// The key as a request is looked up by; its owned form becomes the stored key the
    /// first time a key is seen.
    type Lookup: ?Sized + Hash + Eq + ToOwned<Owned: Into<Self::Key>>;

    /// The request's key, borrowed from `parts` where it can be, or `None` when the request
    /// has none.
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Cow<'a, Self::Lookup>>;

    /// What a layer does with a request [`extract`](Self::extract) finds no key in, unless
    /// [`RateLimitBuilder::missing_key`](crate::RateLimitBuilder::missing_key) says
    /// otherwise. Default: [`MissingKey::Reject`], because a key that is missing is most
    /// often a server that does not provide it; override it for keys a client may lack.
    fn missing_key(&self) -> MissingKey {
        MissingKey::Reject
    }

    /// The address of the request's client, whose network a new key past the limit's key
    /// cap is charged to: each network's new keys past the cap share an overflow limit of
    /// their own (see [`KeyedLimiter`](crate::keyed::KeyedLimiter)), so that one network
    /// minting keys cannot push other networks' new clients out. Asked only for such a key,
    /// never on a known key's path.
    ///
    /// Default: the client address the server resolved
    /// (`overload_signal::signal::client_addr`: a `ClientAddr` a layer left in the request
    /// behind trusted proxies, or else the connection's peer); [`ClientIp`](super::ClientIp)
    /// answers the address it keys by. `None` when the request has none: such requests are
    /// one network.
    fn client_addr(&self, parts: &Parts) -> Option<IpAddr> {
        client_addr(&parts.extensions)
    }
}

impl<F, K> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    type Key = K;
    type Lookup = K;

    #[inline]
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Cow<'a, K>> {
        self(parts).map(Cow::Owned)
    }
}

/// The key extractor of a layer that has none: one global limit for every request.
///
/// It has no values: it only fills the key parameter of
/// [`RateLimitBuilder`](crate::RateLimitBuilder) until
/// [`key_by`](crate::RateLimitBuilder::key_by) sets a real one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoKey {}

impl KeyExtractor for NoKey {
    type Key = ();
    type Lookup = ();

    fn extract<'a>(&self, _: &'a Parts) -> Option<Cow<'a, ()>> {
        match *self {}
    }
}
