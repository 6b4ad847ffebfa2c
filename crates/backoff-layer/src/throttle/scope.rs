//! [`ThrottleScope`] and [`ThrottleKey`]: which requests share one throttle state, and the
//! key and name of a request's destination.

use std::borrow::Cow;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};

use http::Uri;
use http::request::Parts;

/// Which requests share one throttle state.
///
/// Whatever the scope (but [`Layer`](Self::Layer)), a request carrying a [`ThrottleKey`] in
/// its extensions is tracked under its destination and that key.
///
/// ```
/// use backoff_layer::throttle::{Throttle, ThrottleScope};
///
/// // One state for everything the layer sends: a layer in front of one service.
/// let throttle = Throttle::builder().scope(ThrottleScope::Layer).build()?;
/// // One state per path of each destination: a route whose dependency is down does not
/// // throttle the other routes of its host.
/// let per_route = Throttle::builder().scope(ThrottleScope::Route).build()?;
/// # let _ = (throttle, per_route);
/// # Ok::<(), backoff_layer::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ThrottleScope {
    /// One state per destination: the request URI's scheme, host (case-insensitive) and
    /// port (`http://10.0.0.7:8080`; the port the scheme implies when the URI has none;
    /// never the user information, `user:secret@`). Requests without an authority share one
    /// destination, `(no authority)`: a tonic generated client's requests have none at the
    /// layer (its `Channel` fills the origin in below), so build each client `with_origin`
    /// (`HealthClient::with_origin(channel, origin)`), and its requests carry their
    /// channel's origin and are tracked under it; or name each with a [`ThrottleKey`]. The
    /// default.
    #[default]
    Destination,
    /// One state per destination and path (the query left out, the path as written: `/a`,
    /// `/a/` and `/%61` are three): for a host whose routes fail apart, such as one whose
    /// `/reports` depend on a database that is down while its `/orders` are served. Paths
    /// with identifiers in them (`/users/1234`), or paths a proxy takes from its clients,
    /// make a destination each, up to the table's size, beyond which requests go
    /// unthrottled; name routes with a [`ThrottleKey`] instead.
    Route,
    /// One state for every request the layer sends, named `(layer)`: for a layer in front of
    /// one service whatever its requests' URIs say.
    Layer,
}

/// A route name of your own, put in a request's extensions: the throttle tracks the request
/// under its destination and this key, whatever the [`ThrottleScope`] (but `Layer`).
///
/// For routes a path does not name well (`/users/{id}`), or requests of one path that
/// depend on different things:
///
/// ```
/// use backoff_layer::throttle::ThrottleKey;
///
/// let mut request = http::Request::get("http://users.internal/users/1234")
///     .body(String::new())
///     .unwrap();
/// request.extensions_mut().insert(ThrottleKey::new("users.get"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ThrottleKey(Cow<'static, str>);

impl ThrottleKey {
    /// A key of this name. A destination's name in gauges and logs (its scheme, host, port
    /// and key) is cut at 256 bytes; the key itself is not.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self(name.into())
    }

    /// The key's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ThrottleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ThrottleKey").field(&self.as_str()).finish()
    }
}

/// What the throttle needs of a request to find its destination.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target<'a> {
    pub(crate) uri: &'a Uri,
    pub(crate) key: Option<&'a ThrottleKey>,
}

impl<'a> Target<'a> {
    /// The target of a request.
    #[inline]
    pub(crate) fn of(parts: &'a Parts) -> Self {
        Self {
            uri: &parts.uri,
            // NOTE: an extension lookup is a branch on an empty map for most requests.
            key: parts.extensions.get::<ThrottleKey>(),
        }
    }

    /// The target of a bare URI.
    pub(crate) const fn uri(uri: &'a Uri) -> Self {
        Self { uri, key: None }
    }
}

/// The key of every request of a [`ThrottleScope::Layer`] throttle.
const LAYER_KEY: u64 = 1;

/// The longest destination name a gauge or log is given, in bytes; longer ones are cut.
const MAX_LABEL: usize = 256;

/// Turns a request's target into its destination's key (nonzero) and name.
pub(crate) struct DestinationKeys {
    scope: ThrottleScope,
    /// foldhash's quality hasher, seeded at random per throttle: a request's key costs a few
    /// nanoseconds (SipHash-1-3 cost about 300 instructions for `http` and `127.0.0.1`).
    /// Two destinations share a state only if their 64-bit keys collide: about 2^-64 for a
    /// pair; foldhash is only minimally resistant to inputs crafted against it, and nothing
    /// of its seed or its output leaves the process.
    hasher: KeyHasher,
}

/// The keys' hasher: seeded at random (see [`DestinationKeys`]); under `cfg(loom)` with a
/// fixed seed, since a loom model must explore the same interleavings on every run and a
/// key decides where a destination's slot is probed for.
#[cfg(not(loom))]
type KeyHasher = foldhash::quality::RandomState;
#[cfg(loom)]
type KeyHasher = foldhash::quality::FixedState;

impl DestinationKeys {
    pub(crate) fn new(scope: ThrottleScope) -> Self {
        Self {
            scope,
            hasher: KeyHasher::default(),
        }
    }

    /// The key of `target`'s destination: never 0 (a free slot).
    #[inline]
    pub(crate) fn key(&self, target: Target<'_>) -> u64 {
        if self.scope == ThrottleScope::Layer {
            return LAYER_KEY;
        }
        let mut state = self.hasher.build_hasher();
        match target.uri.authority() {
            None => state.write_u8(0),
            Some(authority) => {
                // NOTE: the host (case-insensitive: `API.example` is `api.example`) and
                // port, never the user information; the scheme's own port when none is
                // written, so `http://a` and `http://a:80` are one.
                state.write_u8(1);
                for byte in authority.host().bytes() {
                    state.write_u8(byte.to_ascii_lowercase());
                }
                let scheme = target.uri.scheme_str().unwrap_or("http");
                state.write_u16(authority.port_u16().unwrap_or(default_port(scheme)));
                scheme.hash(&mut state);
            }
        }
        match target.key {
            Some(key) => {
                state.write_u8(2);
                key.as_str().hash(&mut state);
            }
            None if self.scope == ThrottleScope::Route => {
                state.write_u8(3);
                target.uri.path().hash(&mut state);
            }
            None => {}
        }
        // NOTE: `| 2` keeps every key apart from 0 (free) and `LAYER_KEY`.
        state.finish() | 2
    }

    /// The name of `target`'s destination, for its gauge and logs: scheme, host and port
    /// (never the user information), then the route or the key.
    pub(crate) fn label(&self, target: Target<'_>) -> Box<str> {
        use std::fmt::Write;
        if self.scope == ThrottleScope::Layer {
            return "(layer)".into();
        }
        let mut label = match target.uri.authority() {
            None => "(no authority)".to_owned(),
            Some(authority) => {
                let scheme = target.uri.scheme_str().unwrap_or("http");
                let port = authority.port_u16().unwrap_or(default_port(scheme));
                let host = authority.host().to_ascii_lowercase();
                format!("{scheme}://{host}:{port}")
            }
        };
        match target.key {
            Some(key) => {
                let _ = write!(label, " [{}]", key.as_str());
            }
            None if self.scope == ThrottleScope::Route => label.push_str(target.uri.path()),
            None => {}
        }
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

/// The `server_address` of `uri`'s destination, for the retry layer's series per
/// destination: the host (lower case, never the user information), with `:port` when the
/// URI names a port other than its scheme's ([`default_port`]), as OpenTelemetry's
/// `server.address` and `server.port` would print together (`api.internal`,
/// `10.0.0.7:8080`, `[::1]:3000`); `(no authority)` for a URI without one. Cut at 256
/// bytes, as a throttle's label is.
pub(crate) fn server_address(uri: &Uri) -> String {
    let Some(authority) = uri.authority() else {
        return "(no authority)".to_owned();
    };
    let mut address = authority.host().to_ascii_lowercase();
    let scheme = uri.scheme_str().unwrap_or("http");
    if let Some(port) = authority.port_u16().filter(|&p| p != default_port(scheme)) {
        address.push(':');
        address.push_str(&port.to_string());
    }
    if address.len() > MAX_LABEL {
        let mut end = MAX_LABEL;
        while !address.is_char_boundary(end) {
            end -= 1;
        }
        address.truncate(end);
    }
    address
}

/// The port a scheme implies: 443 for `https` and `wss`, 80 otherwise.
fn default_port(scheme: &str) -> u16 {
    if scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("wss") {
        443
    } else {
        80
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, key: Option<&'static str>) -> Parts {
        let mut request = http::Request::get(uri).body(()).unwrap();
        if let Some(key) = key {
            request.extensions_mut().insert(ThrottleKey::new(key));
        }
        request.into_parts().0
    }

    #[test]
    fn destinations_are_scheme_host_and_port() {
        let keys = DestinationKeys::new(ThrottleScope::Destination);
        let key = |s: &str| keys.key(Target::uri(&s.parse().unwrap()));
        assert_eq!(key("http://a:1/x"), key("http://a:1/y?z"));
        assert_ne!(key("http://a:1/x"), key("http://a:2/x"));
        assert_ne!(key("http://a:1/x"), key("https://a:1/x"));
        assert_ne!(key("http://a:1/x"), key("ws://a:1/x"));
        assert_eq!(key("https://a:1/x"), key("https://a:1/y"));
        assert_eq!(key("http://a/x"), key("http://a:80/x"), "the scheme's port");
        assert_eq!(key("https://a/x"), key("https://a:443/x"));
        assert_ne!(key("http://a:1/"), LAYER_KEY);
        assert_ne!(key("http://a:1/"), 0);
        let label = |s: &str| keys.label(Target::uri(&s.parse().unwrap()));
        assert_eq!(&*label("http://a:1/x"), "http://a:1");
        assert_eq!(&*label("https://a/x"), "https://a:443");
        let long = format!("http://{}:1/", "h".repeat(400));
        assert_eq!(label(&long).len(), MAX_LABEL);
    }

    /// Regression (issue 30, finding 3; and issue 31's finding 5): the key and the label
    /// were the URI's authority as written, user information included: a secret in every
    /// gauge and log line, and one destination per set of credentials.
    #[test]
    fn user_information_is_never_part_of_a_destination() {
        let keys = DestinationKeys::new(ThrottleScope::Destination);
        let with = "http://user:secret@a:1/x".parse().unwrap();
        let without = "http://a:1/x".parse().unwrap();
        assert_eq!(
            keys.key(Target::uri(&with)),
            keys.key(Target::uri(&without))
        );
        let label = keys.label(Target::uri(&with));
        assert_eq!(&*label, "http://a:1");
        assert!(!label.contains("secret"));
    }

    #[test]
    fn requests_without_an_authority_share_one_destination_and_hosts_ignore_case() {
        let keys = DestinationKeys::new(ThrottleScope::Destination);
        let key = |s: &str| keys.key(Target::uri(&s.parse().unwrap()));
        assert_eq!(key("/pkg.Health/Check"), key("/pkg.Other/Call"));
        assert_ne!(key("/pkg.Health/Check"), key("http://a:1/pkg.Health/Check"));
        assert_eq!(
            &*keys.label(Target::uri(&"/x".parse().unwrap())),
            "(no authority)"
        );
        assert_eq!(key("http://API.example:1/"), key("http://api.example:1/"));
        assert_eq!(
            &*keys.label(Target::uri(&"http://API.example:1/".parse().unwrap())),
            "http://api.example:1"
        );
    }

    #[test]
    fn routes_and_keys_of_ones_own() {
        let by_route = DestinationKeys::new(ThrottleScope::Route);
        let (bad, good) = (
            parts("http://a:1/bad?x", None),
            parts("http://a:1/good", None),
        );
        assert_ne!(
            by_route.key(Target::of(&bad)),
            by_route.key(Target::of(&good))
        );
        assert_eq!(
            by_route.key(Target::of(&bad)),
            by_route.key(Target::of(&parts("http://a:1/bad?y", None)))
        );
        assert_eq!(&*by_route.label(Target::of(&bad)), "http://a:1/bad");

        let by_host = DestinationKeys::new(ThrottleScope::Destination);
        let (k1, k2) = (
            parts("http://a:1/users/1", Some("users.get")),
            parts("http://a:1/users/2", Some("users.get")),
        );
        assert_eq!(by_host.key(Target::of(&k1)), by_host.key(Target::of(&k2)));
        assert_ne!(
            by_host.key(Target::of(&k1)),
            by_host.key(Target::of(&parts("http://a:1/users/1", None)))
        );
        assert_eq!(&*by_host.label(Target::of(&k1)), "http://a:1 [users.get]");
        // A key is the same whatever the path, in the route scope too.
        assert_eq!(by_route.key(Target::of(&k1)), by_route.key(Target::of(&k2)));
    }

    #[test]
    fn server_addresses_leave_the_default_port_out() {
        let address = |s: &str| server_address(&s.parse().unwrap());
        assert_eq!(address("http://API.example/x"), "api.example");
        assert_eq!(address("http://api.example:80/x"), "api.example");
        assert_eq!(address("https://api.example:443/x"), "api.example");
        assert_eq!(address("https://api.example:80/x"), "api.example:80");
        assert_eq!(address("http://10.0.0.7:8080/x"), "10.0.0.7:8080");
        assert_eq!(address("http://[::1]:3000/"), "[::1]:3000");
        assert_eq!(address("http://user:secret@host.test/"), "host.test");
        assert_eq!(address("/relative"), "(no authority)");
        let long = format!("http://{}:1/", "h".repeat(400));
        assert_eq!(address(&long).len(), MAX_LABEL);
    }

    #[test]
    fn a_layer_scope_is_one_destination() {
        let keys = DestinationKeys::new(ThrottleScope::Layer);
        let a = parts("http://a:1/", Some("k"));
        assert_eq!(
            keys.key(Target::uri(&"http://a:1/".parse().unwrap())),
            LAYER_KEY
        );
        assert_eq!(keys.key(Target::of(&a)), LAYER_KEY);
        assert_eq!(
            &*keys.label(Target::uri(&"http://a:1/".parse().unwrap())),
            "(layer)"
        );
    }
}
