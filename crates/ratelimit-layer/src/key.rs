//! Which key a request is limited under: the client's IP address ([`ClientIp`]), a header
//! value ([`HeaderKey`]), or anything a closure or a [`KeyExtractor`] of your own extracts.
//!
//! Extractors see the request head ([`Parts`]) and return `None` when the request has no
//! key; what happens to such a request is the layer's [`MissingKey`] policy: a `500`, one
//! shared limit ([`KeyClass::Unkeyed`](crate::keyed::KeyClass)), or no limit. The first such
//! request is logged at `WARN`, whatever the policy.
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

use std::borrow::{Borrow, Cow};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use http::request::Parts;
use http::{Extensions, HeaderMap, HeaderName};
use overload_core::ConfigError;
use overload_signal::signal::CallerKey;

/// What a keyed limit does with a request from which its extractor gets no key, chosen when
/// the layer is built ([`RateLimitBuilder::missing_key`](crate::RateLimitBuilder::missing_key)).
///
/// Whichever it is, the first such request is logged at `WARN` (once per layer), and the
/// counter `ratelimit_layer_missing_key_total` counts them all, so a key that is missing by
/// mistake is never silent.
///
/// Default: the extractor's ([`KeyExtractor::missing_key`]): [`Reject`](Self::Reject) for
/// [`ClientIp`] and closures, [`Shared`](Self::Shared) for [`HeaderKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MissingKey {
    /// Answer `500 Internal Server Error` (for gRPC, `grpc-status: 13`, `INTERNAL`) without
    /// calling the inner service: the key is missing because the server is not set up to
    /// provide it (axum served without `into_make_service_with_connect_info`, an
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
/// that a known key costs no allocation: [`HeaderKey`] stores `Box<[u8]>` and looks up the
/// header's bytes in place. The two must hash and compare alike, as [`Borrow`] requires.
///
/// Implemented by [`ClientIp`], [`HeaderKey`], and every closure
/// `Fn(&Parts) -> Option<K>` whose key `K` is `Hash + Eq + Clone + Send + Sync`. A closure
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

/// An IP network such as `10.0.0.0/8` or `2001:db8::/32`; a bare address is a network of
/// one. IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are matched as the IPv4 address.
///
/// ```
/// use ratelimit_layer::key::IpNet;
///
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse().unwrap()));
/// assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse().unwrap()));
/// assert_eq!(
///     "10.0.0.0/33".parse::<IpNet>().unwrap_err().to_string(),
///     "ip_net must be an IPv4 address with a prefix length of at most 32, got \"10.0.0.0/33\""
/// );
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// The network of `addr` with a `prefix`-bit mask (the host bits are cleared).
    ///
    /// # Errors
    ///
    /// A prefix longer than the address (32 bits for IPv4, 128 for IPv6): a
    /// [`ConfigError`] of kind `OutOfRange` on `prefix`.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, ConfigError> {
        let addr = addr.to_canonical();
        let max = max_prefix(addr);
        if prefix > max {
            return Err(ConfigError::out_of_range(
                "prefix",
                prefix,
                if addr.is_ipv4() {
                    "at most 32 for an IPv4 address"
                } else {
                    "at most 128 for an IPv6 address"
                },
            ));
        }
        Ok(Self {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// Whether `ip` is in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

impl FromStr for IpNet {
    type Err = ConfigError;

    /// Parses `192.0.2.0/24`, `2001:db8::/32` or a bare address.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] of kind `Invalid` on `ip_net`, quoting the text.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let invalid = |rule| ConfigError::invalid("ip_net", s, rule);
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| invalid("an IP address or network such as 10.0.0.0/8"))?;
        let addr = addr.to_canonical();
        let max = max_prefix(addr);
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&n| {
                    n <= max
                        && !p.is_empty()
                        && p.len() <= 3
                        && p.bytes().all(|b| b.is_ascii_digit())
                })
                .ok_or_else(|| {
                    invalid(if addr.is_ipv4() {
                        "an IPv4 address with a prefix length of at most 32"
                    } else {
                        "an IPv6 address with a prefix length of at most 128"
                    })
                })?,
        };
        Self::new(addr, prefix)
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// `ip` with all but its first `prefix` bits cleared (`prefix` within the address length).
fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = bits.checked_shr(32 - u32::from(prefix)).unwrap_or(0);
            let bits = kept.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(bits.into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = bits.checked_shr(128 - u32::from(prefix)).unwrap_or(0);
            let bits = kept.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
    }
}

/// The header that carries client addresses through trusted proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (de facto standard; addresses, possibly
    /// with a port).
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239); the `for` parameter of each element.
    Forwarded,
}

impl ForwardedHeader {
    /// The header's name.
    pub fn name(self) -> HeaderName {
        match self {
            Self::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            Self::Forwarded => http::header::FORWARDED,
        }
    }
}

type PeerFn = dyn Fn(&Extensions) -> Option<SocketAddr> + Send + Sync;

/// The client's IP address, as a rate-limit key.
///
/// # Where the peer address comes from
///
/// The connection's peer address is read from a request extension, which the server puts
/// there:
///
/// - [`ClientIp::new`] (the default) reads a [`SocketAddr`] extension.
/// - [`ClientIp::from_extension`] reads any extension type through a function. For axum,
///   serve with `into_make_service_with_connect_info::<SocketAddr>()` and read
///   `axum::extract::ConnectInfo<SocketAddr>`:
///   `ClientIp::from_extension(|c: &ConnectInfo<SocketAddr>| Some(c.0))`. For tonic, read
///   `tonic::transport::server::TcpConnectInfo`:
///   `ClientIp::from_extension(|c: &TcpConnectInfo| c.remote_addr())`. (This crate does not
///   depend on either.)
///
/// A request without the extension has no key.
///
/// # Proxies
///
/// By default forwarding headers are **ignored**: anyone can send `X-Forwarded-For`, so
/// trusting it would let a client pick its own key and escape its limit. When the server
/// sits behind proxies, name them with [`ClientIpBuilder::trust_proxies`]: if the peer is
/// one of them, the chosen header is read from right to left (nearest proxy first),
/// skipping trusted proxies; the first address that is not a trusted proxy is the client.
/// Only the one header you name is read, never both.
///
/// # IPv6
///
/// IPv6 clients are keyed by their `/64` network by default: one host usually holds a
/// whole `/64` (RFC 6177) and could otherwise rotate addresses to escape its limit. Change
/// it with [`ClientIpBuilder::ipv6_prefix`] (`128` keys exact addresses). IPv4-mapped IPv6
/// addresses count as IPv4.
///
/// # Examples
///
/// ```
/// use std::net::SocketAddr;
/// use ratelimit_layer::key::{ClientIp, ForwardedHeader};
///
/// // The defaults: the `SocketAddr` extension, no trusted proxy, IPv6 keyed by /64.
/// let direct = ClientIp::new();
///
/// // Behind a load balancer in 10.0.0.0/8 that appends to `X-Forwarded-For`.
/// let behind_proxies = ClientIp::builder()
///     .trust_proxies(ForwardedHeader::XForwardedFor, ["10.0.0.0/8".parse()?])
///     .ipv6_prefix(56)
///     .build()?;
/// # let _ = (direct, behind_proxies);
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ClientIp {
    peer: Arc<PeerFn>,
    trusted: Arc<[IpNet]>,
    header: HeaderName,
    ipv6_prefix: u8,
}

impl ClientIp {
    /// The default IPv6 key prefix: `/64`, because RFC 6177 assigns a `/64` or more per
    /// site, so one host can hold a whole `/64`.
    pub const DEFAULT_IPV6_PREFIX: u8 = 64;

    /// Reads the peer address from a [`SocketAddr`] request extension; no trusted proxies;
    /// IPv6 keyed by `/64`.
    pub fn new() -> Self {
        Self::from_extension(|addr: &SocketAddr| Some(*addr))
    }

    /// Reads the peer address from a request extension of type `T` through `peer`; no
    /// trusted proxies; IPv6 keyed by `/64`.
    pub fn from_extension<T, F>(peer: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> Option<SocketAddr> + Send + Sync + 'static,
    {
        Self {
            peer: Arc::new(move |ext: &Extensions| ext.get::<T>().and_then(&peer)),
            trusted: Arc::new([]),
            header: ForwardedHeader::XForwardedFor.name(),
            ipv6_prefix: Self::DEFAULT_IPV6_PREFIX,
        }
    }

    /// A builder starting from the defaults of [`new`](Self::new).
    pub fn builder() -> ClientIpBuilder {
        ClientIpBuilder {
            client_ip: Self::new(),
            forwarded: ForwardedHeader::XForwardedFor,
            ipv6_prefix: Self::DEFAULT_IPV6_PREFIX,
        }
    }

    /// The client address of a request (masked to the IPv6 prefix), if the peer address
    /// extension is present.
    pub fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = (self.peer)(&parts.extensions)?.ip().to_canonical();
        Some(self.mask(self.behind_proxies(peer, &parts.headers)))
    }

    fn mask(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(_) => mask(ip, self.ipv6_prefix),
        }
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(ip))
    }

    fn behind_proxies(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let forwarded = self.header == http::header::FORWARDED;
        let mut client = peer;
        // Nearest proxy first: the last line, its last element.
        for line in headers.get_all(&self.header).iter().rev() {
            let Ok(line) = line.to_str() else {
                return client;
            };
            for element in line.rsplit(',') {
                let hop = if forwarded {
                    forwarded_for(element)
                } else {
                    parse_node(element.trim())
                };
                // NOTE: an element we cannot read ends the walk: nothing left of it can be
                // attributed to a trusted proxy.
                let Some(hop) = hop else {
                    return client;
                };
                client = hop.to_canonical();
                if !self.is_trusted(client) {
                    return client;
                }
            }
        }
        client
    }
}

impl Default for ClientIp {
    /// The same as [`ClientIp::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIp")
            .field("trusted", &self.trusted)
            .field("header", &self.header)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .finish_non_exhaustive()
    }
}

impl KeyExtractor for ClientIp {
    type Key = IpAddr;
    type Lookup = IpAddr;

    #[inline]
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Cow<'a, IpAddr>> {
        self.client_ip(parts).map(Cow::Owned)
    }

    /// [`MissingKey::Reject`]: every connection has a peer, so a request without one comes
    /// from a server that does not put it in the request's extensions.
    fn missing_key(&self) -> MissingKey {
        MissingKey::Reject
    }
}

/// The overload layer tells callers apart by the same address as the limit (with the same
/// trusted proxies and IPv6 prefix).
impl CallerKey for ClientIp {
    fn hash_key(&self, parts: &Parts, mut state: &mut dyn Hasher) -> bool {
        match self.client_ip(parts) {
            Some(ip) => {
                ip.hash(&mut state);
                true
            }
            None => false,
        }
    }
}

/// Builds a [`ClientIp`]; from [`ClientIp::builder`].
#[must_use]
pub struct ClientIpBuilder {
    client_ip: ClientIp,
    forwarded: ForwardedHeader,
    ipv6_prefix: u8,
}

impl ClientIpBuilder {
    /// Reads the peer address from a request extension of type `T` through `peer`.
    /// Default: a [`SocketAddr`] extension (see [`ClientIp`] for axum's and tonic's).
    pub fn peer_from_extension<T, F>(mut self, peer: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> Option<SocketAddr> + Send + Sync + 'static,
    {
        self.client_ip.peer = ClientIp::from_extension(peer).peer;
        self
    }

    /// Trusts `proxies`: when the peer is one of them, the client address is read from
    /// `header`. Default: nobody is trusted, and forwarding headers are ignored.
    pub fn trust_proxies(
        mut self,
        header: ForwardedHeader,
        proxies: impl IntoIterator<Item = IpNet>,
    ) -> Self {
        self.client_ip.trusted = proxies.into_iter().collect();
        self.forwarded = header;
        self
    }

    /// Keys IPv6 clients by their first `bits` bits (`128` keys exact addresses).
    /// Default: 64 ([`ClientIp::DEFAULT_IPV6_PREFIX`]).
    pub const fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits;
        self
    }

    /// Builds the extractor.
    ///
    /// # Errors
    ///
    /// An `ipv6_prefix` above 128: a [`ConfigError`] of kind `OutOfRange`.
    pub fn build(self) -> Result<ClientIp, ConfigError> {
        if self.ipv6_prefix > 128 {
            return Err(ConfigError::out_of_range(
                "ipv6_prefix",
                self.ipv6_prefix,
                "at most 128",
            ));
        }
        Ok(ClientIp {
            header: self.forwarded.name(),
            ipv6_prefix: self.ipv6_prefix,
            ..self.client_ip
        })
    }
}

impl fmt::Debug for ClientIpBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIpBuilder")
            .field("trusted", &self.client_ip.trusted)
            .field("header", &self.forwarded)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .finish_non_exhaustive()
    }
}

/// The `for` parameter of one `Forwarded` element, as an address.
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (key, value) = pair.trim().split_once('=')?;
        if !key.trim().eq_ignore_ascii_case("for") {
            return None;
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        parse_node(value)
    })
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
/// `[2001:db8::1]` or `[2001:db8::1]:80`.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Some(rest) = s.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        return addr.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    let (addr, port) = s.rsplit_once(':')?;
    if !is_port(port) {
        return None;
    }
    addr.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit())
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut builder = Request::builder();
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let mut req = builder.body(()).unwrap();
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        req.into_parts().0
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forwarding_headers_are_ignored_by_default() {
        let p = parts("203.0.113.9:5000", &[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(ClientIp::new().client_ip(&p), Some(ip("203.0.113.9")));
        let p = parts("203.0.113.9:5000", &[("forwarded", "for=1.2.3.4")]);
        assert_eq!(ClientIp::default().client_ip(&p), Some(ip("203.0.113.9")));
    }

    #[test]
    fn x_forwarded_for_behind_trusted_proxies() {
        let c = ClientIp::builder()
            .trust_proxies(
                ForwardedHeader::XForwardedFor,
                ["10.0.0.0/8".parse().unwrap()],
            )
            .build()
            .unwrap();
        // The client forged the first entry; the proxy appended the real address.
        let p = parts(
            "10.0.0.2:80",
            &[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.1")],
        );
        assert_eq!(c.client_ip(&p), Some(ip("198.51.100.7")));
        // Several header lines are one list, in order.
        let p = parts(
            "10.0.0.2:80",
            &[
                ("x-forwarded-for", "6.6.6.6"),
                ("x-forwarded-for", "198.51.100.7:4711"),
            ],
        );
        assert_eq!(c.client_ip(&p), Some(ip("198.51.100.7")));
        // An untrusted peer's header is ignored.
        let p = parts("198.51.100.1:80", &[("x-forwarded-for", "6.6.6.6")]);
        assert_eq!(c.client_ip(&p), Some(ip("198.51.100.1")));
        // Junk stops the walk at the last trusted hop.
        let p = parts("10.0.0.2:80", &[("x-forwarded-for", "junk, 10.0.0.1")]);
        assert_eq!(c.client_ip(&p), Some(ip("10.0.0.1")));
        // No header: the proxy itself.
        let p = parts("10.0.0.2:80", &[]);
        assert_eq!(c.client_ip(&p), Some(ip("10.0.0.2")));
        // The other header is not read.
        let p = parts("10.0.0.2:80", &[("forwarded", "for=1.2.3.4")]);
        assert_eq!(c.client_ip(&p), Some(ip("10.0.0.2")));
    }

    #[test]
    fn forwarded_behind_trusted_proxies() {
        let c = ClientIp::builder()
            .trust_proxies(ForwardedHeader::Forwarded, ["10.0.0.1".parse().unwrap()])
            .build()
            .unwrap();
        let p = parts(
            "10.0.0.1:80",
            &[(
                "forwarded",
                "for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https, For=10.0.0.1",
            )],
        );
        assert_eq!(c.client_ip(&p), Some(ip("2001:db8:cafe::")));
        let p = parts("10.0.0.1:80", &[("forwarded", "for=unknown")]);
        assert_eq!(c.client_ip(&p), Some(ip("10.0.0.1")));
        let p = parts(
            "10.0.0.1:80",
            &[("forwarded", "proto=http;for=192.0.2.43:80")],
        );
        assert_eq!(c.client_ip(&p), Some(ip("192.0.2.43")));
    }

    #[test]
    fn ipv6_is_keyed_by_prefix() {
        let p = parts("[2001:db8:1:2:3:4:5:6]:443", &[]);
        assert_eq!(
            ClientIp::default().client_ip(&p),
            Some(ip("2001:db8:1:2::"))
        );
        let exact = ClientIp::builder().ipv6_prefix(128).build().unwrap();
        assert_eq!(exact.client_ip(&p), Some(ip("2001:db8:1:2:3:4:5:6")));
        let err = ClientIp::builder().ipv6_prefix(129).build().unwrap_err();
        assert_eq!(err.field(), "ipv6_prefix");
        assert_eq!(err.to_string(), "ipv6_prefix must be at most 128, got 129");
        // A custom extension and trusted proxies survive the other setters.
        #[derive(Clone)]
        struct Peer(SocketAddr);
        let c = ClientIp::builder()
            .peer_from_extension(|p: &Peer| Some(p.0))
            .ipv6_prefix(48)
            .build()
            .unwrap();
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(Peer("[2001:db8:1:2::9]:1".parse().unwrap()));
        assert_eq!(c.client_ip(&req.into_parts().0), Some(ip("2001:db8:1::")));
        // IPv4-mapped addresses are IPv4.
        let p = parts("[::ffff:192.0.2.1]:443", &[]);
        assert_eq!(ClientIp::default().client_ip(&p), Some(ip("192.0.2.1")));
    }

    #[test]
    fn other_extensions_and_missing_ones() {
        #[derive(Clone)]
        struct ConnectInfo(SocketAddr);
        let c = ClientIp::from_extension(|ci: &ConnectInfo| Some(ci.0));
        let mut req = Request::new(());
        assert_eq!(c.client_ip(&req.clone().into_parts().0), None);
        req.extensions_mut()
            .insert(ConnectInfo("192.0.2.8:1".parse().unwrap()));
        assert_eq!(c.client_ip(&req.into_parts().0), Some(ip("192.0.2.8")));
    }

    #[test]
    fn ip_networks() {
        let net: IpNet = "192.168.0.0/16".parse().unwrap();
        assert!(net.contains(ip("192.168.255.1")));
        assert!(!net.contains(ip("192.169.0.1")));
        assert_eq!(net.to_string(), "192.168.0.0/16");
        assert_eq!(
            "10.1.2.3/8".parse::<IpNet>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert!(
            "0.0.0.0/0"
                .parse::<IpNet>()
                .unwrap()
                .contains(ip("8.8.8.8"))
        );
        assert!(!"0.0.0.0/0".parse::<IpNet>().unwrap().contains(ip("::1")));
        assert!("::1".parse::<IpNet>().unwrap().contains(ip("::1")));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/x",
            "10.0.0.0/-1",
        ] {
            let err = bad.parse::<IpNet>().unwrap_err();
            assert_eq!(err.field(), "ip_net", "{bad}");
            assert!(
                err.to_string().contains("prefix length of at most"),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains(bad), "{bad}: {err}");
        }
        assert_eq!(
            "nope/8".parse::<IpNet>().unwrap_err().to_string(),
            "ip_net must be an IP address or network such as 10.0.0.0/8, got \"nope/8\""
        );
        let err = IpNet::new(ip("10.0.0.0"), 33).unwrap_err();
        assert_eq!(
            (err.field(), err.to_string().as_str()),
            (
                "prefix",
                "prefix must be at most 32 for an IPv4 address, got 33"
            )
        );
    }

    #[test]
    fn header_keys_are_borrowed_from_the_request() {
        let extract = HeaderKey::new(HeaderName::from_static("x-api-key"));
        let p = parts("192.0.2.1:1", &[("x-api-key", "abc")]);
        let key = extract.extract(&p).unwrap();
        assert!(matches!(key, Cow::Borrowed(b"abc")), "not copied");
        assert_eq!(extract.extract(&parts("192.0.2.1:1", &[])), None);
        let long = "k".repeat(HeaderKey::MAX_LEN + 1);
        assert_eq!(
            extract.extract(&parts("192.0.2.1:1", &[("x-api-key", &long)])),
            None
        );
        let longest = "k".repeat(HeaderKey::MAX_LEN);
        assert!(
            extract
                .extract(&parts("192.0.2.1:1", &[("x-api-key", &longest)]))
                .is_some()
        );
    }

    #[test]
    fn missing_key_defaults_and_caller_keys() {
        let header = HeaderKey::new(HeaderName::from_static("x-api-key"));
        assert_eq!(ClientIp::new().missing_key(), MissingKey::Reject);
        assert_eq!(header.missing_key(), MissingKey::Shared);
        let closure = |parts: &Parts| Some(parts.uri.path().to_owned());
        assert_eq!(closure.missing_key(), MissingKey::Reject);
        assert_eq!(
            [MissingKey::Reject, MissingKey::Shared, MissingKey::Bypass].map(MissingKey::as_str),
            ["reject", "shared", "bypass"]
        );
        // As caller keys for the overload layer: the same key, or none, as for the limit.
        let hash = |key: &dyn CallerKey, parts: &Parts| {
            let mut h = std::hash::DefaultHasher::new();
            key.hash_key(parts, &mut h).then(|| h.finish())
        };
        let a = parts("192.0.2.1:1", &[("x-api-key", "k1")]);
        let b = parts("192.0.2.1:2", &[("x-api-key", "k2")]);
        let c = parts("192.0.2.2:1", &[]);
        assert_eq!(hash(&ClientIp::new(), &a), hash(&ClientIp::new(), &b));
        assert_ne!(hash(&ClientIp::new(), &a), hash(&ClientIp::new(), &c));
        assert_eq!(
            hash(&ClientIp::new(), &Request::new(()).into_parts().0),
            None
        );
        assert_ne!(hash(&header, &a), hash(&header, &b));
        assert_eq!(hash(&header, &c), None);
    }

    #[test]
    fn closures_and_client_ips_are_extractors() {
        let p = parts("192.0.2.7:1", &[("x-tenant", "t1")]);
        let by_path = |parts: &Parts| Some(parts.uri.path().to_owned());
        assert_eq!(by_path.extract(&p).as_deref(), Some(&"/".to_owned()));
        assert_eq!(
            ClientIp::new().extract(&p).as_deref(),
            Some(&ip("192.0.2.7"))
        );
    }
}
