//! [`ThrottleScope`]: which requests share one throttle state, and the key and name of a
//! request's destination.

use std::hash::BuildHasher;

use foldhash::quality::RandomState;

use http::Uri;

/// Which requests share one throttle state.
///
/// ```
/// use backoff_layer::throttle::{Throttle, ThrottleScope};
///
/// // One state for everything the layer sends: a layer in front of one service.
/// let throttle = Throttle::builder().scope(ThrottleScope::Layer).build()?;
/// # let _ = throttle;
/// # Ok::<(), backoff_layer::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ThrottleScope {
    /// One state per destination: the request URI's scheme and authority
    /// (`http://10.0.0.7:8080`), as spelled in the URI. Requests without an authority (a
    /// tonic `Channel`'s, whose channel fills it in below the layer) share one destination,
    /// named `(no authority)`. The default.
    #[default]
    Destination,
    /// One state for every request the layer sends, named `(layer)`: for a layer in front of
    /// one service whatever its requests' URIs say.
    Layer,
}

/// The key of the destination shared by requests without an authority, and by every
/// request of a [`ThrottleScope::Layer`] throttle.
const SHARED_KEY: u64 = 1;

/// The longest destination name a gauge is labelled with, in bytes; longer ones are cut.
const MAX_LABEL: usize = 256;

/// Turns a request's URI into its destination's key (nonzero) and name.
pub(crate) struct DestinationKeys {
    scope: ThrottleScope,
    /// foldhash's quality hasher, seeded at random per throttle: a request's key costs a few
    /// nanoseconds (SipHash-1-3 cost about 300 instructions for `http` and `127.0.0.1`).
    /// Two destinations share a state only if their 64-bit keys collide: about 2^-64 for a
    /// pair; foldhash is only minimally resistant to inputs crafted against it, and nothing
    /// of its seed or its output leaves the process.
    hasher: RandomState,
}

impl DestinationKeys {
    pub(crate) fn new(scope: ThrottleScope) -> Self {
        Self {
            scope,
            hasher: RandomState::default(),
        }
    }

    /// The key of `uri`'s destination: never 0 (a free slot).
    #[inline]
    pub(crate) fn key(&self, uri: &Uri) -> u64 {
        let authority = match (self.scope, uri.authority()) {
            (ThrottleScope::Layer, _) | (_, None) => return SHARED_KEY,
            (ThrottleScope::Destination, Some(authority)) => authority.as_str(),
        };
        // NOTE: the authority alone is hashed (one string, not two); the scheme turns the
        // hash by a bijection of its own, so `http` and `https` of one authority differ.
        // `| 2` keeps every key apart from 0 (free) and `SHARED_KEY`.
        let hash = self.hasher.hash_one(authority);
        let keyed = match uri.scheme_str() {
            Some("http") | None => hash,
            Some("https") => hash.rotate_left(21) ^ 0x9E37_79B9_7F4A_7C15,
            Some(other) => hash ^ self.hasher.hash_one(other).rotate_left(42),
        };
        keyed | 2
    }

    /// The name of `uri`'s destination, for its gauge and logs.
    pub(crate) fn label(&self, uri: &Uri) -> Box<str> {
        let mut label = match (self.scope, uri.authority()) {
            (ThrottleScope::Layer, _) => return "(layer)".into(),
            (_, None) => return "(no authority)".into(),
            (ThrottleScope::Destination, Some(authority)) => match uri.scheme_str() {
                Some(scheme) => format!("{scheme}://{authority}"),
                None => authority.to_string(),
            },
        };
        if label.len() > MAX_LABEL {
            let mut end = MAX_LABEL;
            while !label.is_char_boundary(end) {
                end -= 1;
            }
            label.truncate(end);
        }
        label.into_boxed_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_scheme_and_authority() {
        let keys = DestinationKeys::new(ThrottleScope::Destination);
        let key = |s: &str| keys.key(&s.parse().unwrap());
        assert_eq!(key("http://a:1/x"), key("http://a:1/y?z"));
        assert_ne!(key("http://a:1/x"), key("http://a:2/x"));
        assert_ne!(key("http://a:1/x"), key("https://a:1/x"));
        assert_ne!(key("http://a:1/x"), key("ws://a:1/x"));
        assert_eq!(key("https://a:1/x"), key("https://a:1/y"));
        assert_eq!(key("/only/a/path"), SHARED_KEY);
        assert_ne!(key("http://a:1/"), SHARED_KEY);
        assert_ne!(key("http://a:1/"), 0);
        let label = |s: &str| keys.label(&s.parse().unwrap());
        assert_eq!(&*label("http://a:1/x"), "http://a:1");
        assert_eq!(&*label("/x"), "(no authority)");
        let long = format!("http://{}:1/", "h".repeat(400));
        assert_eq!(label(&long).len(), MAX_LABEL);
    }

    #[test]
    fn a_layer_scope_is_one_destination() {
        let keys = DestinationKeys::new(ThrottleScope::Layer);
        assert_eq!(keys.key(&"http://a:1/".parse().unwrap()), SHARED_KEY);
        assert_eq!(keys.key(&"http://b:2/".parse().unwrap()), SHARED_KEY);
        assert_eq!(&*keys.label(&"http://a:1/".parse().unwrap()), "(layer)");
    }
}
