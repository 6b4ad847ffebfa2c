//! The client's IP address as a key, behind trusted proxies if any: [`ClientIp`].

use std::borrow::Cow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::request::Parts;
use http::{Extensions, HeaderMap, HeaderName};
use overload_core::ConfigError;
use overload_signal::signal::{CallerKey, peer_addr};

use super::extractor::{KeyExtractor, MissingKey};
use super::ip_net::{IpNet, mask};

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
/// - [`ClientIp::new`] (the default) reads it wherever the servers this workspace supports
///   put it (`overload_signal::signal::peer_addr`): a [`SocketAddr`] extension (plain hyper,
///   tests), axum's `ConnectInfo<SocketAddr>` (a router served with
///   `into_make_service_with_connect_info::<SocketAddr>()`; feature `axum`, on by default)
///   and tonic's `TcpConnectInfo` (feature `tonic`, on by default). The overload layer's
///   default caller key reads the same, so a limit and the overload layer see one client
///   alike.
/// - [`ClientIp::from_extension`] reads any other extension type through a function: for
///   tonic over TLS, `TlsConnectInfo<TcpConnectInfo>`:
///   `ClientIp::from_extension(|c: &TlsConnectInfo<TcpConnectInfo>| c.get_ref().remote_addr())`.
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
/// // The defaults: the peer address wherever the server put it, no trusted proxy, IPv6
/// // keyed by /64.
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

    /// Reads the peer address wherever the server put it (a [`SocketAddr`] extension,
    /// axum's `ConnectInfo`, tonic's `TcpConnectInfo`); no trusted proxies; IPv6 keyed by
    /// `/64`.
    pub fn new() -> Self {
        Self {
            peer: Arc::new(peer_addr),
            trusted: Arc::new([]),
            header: ForwardedHeader::XForwardedFor.name(),
            ipv6_prefix: Self::DEFAULT_IPV6_PREFIX,
        }
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
    /// Default: wherever the server put it (see [`ClientIp`]).
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
