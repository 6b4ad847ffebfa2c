//! Which key a request is limited under: the client's IP address, a header value, or
//! anything a closure extracts.
//!
//! Extractors see the request head ([`http::request::Parts`]) and return `None` when the
//! request has no key; such requests share one limit ([`KeyClass::Unkeyed`](crate::KeyClass)).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use http::request::Parts;
use http::{Extensions, HeaderMap, HeaderName};

/// Why an IP network or prefix length was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidIpNet {
    /// The address part is not an IPv4 or IPv6 address.
    Address,
    /// The prefix length is not a decimal number no larger than 32 (IPv4) or 128 (IPv6).
    PrefixLength,
}

impl fmt::Display for InvalidIpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Address => "ip network address is not a valid ipv4 or ipv6 address",
            Self::PrefixLength => {
                "ip network prefix length must be at most 32 for ipv4 and 128 for ipv6"
            }
        })
    }
}

impl std::error::Error for InvalidIpNet {}

/// An IP network such as `10.0.0.0/8` or `2001:db8::/32`; a bare address is a network of
/// one. IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are matched as the IPv4 address.
///
/// ```
/// use ratelimit_layer::IpNet;
///
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse().unwrap()));
/// assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse().unwrap()));
/// # Ok::<(), ratelimit_layer::InvalidIpNet>(())
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
    /// A prefix longer than the address ([`InvalidIpNet::PrefixLength`]).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, InvalidIpNet> {
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(InvalidIpNet::PrefixLength);
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

impl FromStr for IpNet {
    type Err = InvalidIpNet;

    fn from_str(s: &str) -> Result<Self, InvalidIpNet> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => {
                let prefix =
                    if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) {
                        p.parse().map_err(|_| InvalidIpNet::PrefixLength)?
                    } else {
                        return Err(InvalidIpNet::PrefixLength);
                    };
                (a, Some(prefix))
            }
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| InvalidIpNet::Address)?;
        let addr = addr.to_canonical();
        let prefix = prefix.unwrap_or(if addr.is_ipv4() { 32 } else { 128 });
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

type PeerFn = dyn Fn(&Extensions) -> Option<SocketAddr> + Send + Sync;

/// The client's IP address, as a rate-limit key.
///
/// # Where the peer address comes from
///
/// The connection's peer address is read from a request extension, which the server puts
/// there:
///
/// - [`ClientIp::socket_addr`] (the default) reads a [`std::net::SocketAddr`] extension.
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
/// sits behind proxies, name them with [`trust_proxies`](Self::trust_proxies): if the
/// peer is one of them, the chosen header is read from right to left (nearest proxy
/// first), skipping trusted proxies; the first address that is not a trusted proxy is the
/// client. Only the one header you name is read, never both.
///
/// # IPv6
///
/// IPv6 clients are keyed by their `/64` network by default: one host usually holds a
/// whole `/64` (RFC 6177) and could otherwise rotate addresses to escape its limit. Change
/// it with [`ipv6_prefix`](Self::ipv6_prefix) (`128` keys exact addresses). IPv4-mapped
/// IPv6 addresses count as IPv4.
#[derive(Clone)]
pub struct ClientIp {
    peer: Arc<PeerFn>,
    trusted: Arc<[IpNet]>,
    header: ForwardedHeader,
    ipv6_prefix: u8,
}

/// The default IPv6 key prefix: `/64` (RFC 6177 assigns a `/64` or more per site).
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

impl ClientIp {
    /// Reads the peer address from a [`std::net::SocketAddr`] request extension; no
    /// trusted proxies; IPv6 keyed by `/64`.
    pub fn socket_addr() -> Self {
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
            header: ForwardedHeader::XForwardedFor,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Trusts `proxies`: when the peer is one of them, the client address is read from
    /// `header`. An empty list (the default) trusts nobody.
    #[must_use]
    pub fn trust_proxies(
        mut self,
        header: ForwardedHeader,
        proxies: impl IntoIterator<Item = IpNet>,
    ) -> Self {
        self.trusted = proxies.into_iter().collect();
        self.header = header;
        self
    }

    /// Keys IPv6 clients by their first `bits` bits. Default: [`DEFAULT_IPV6_PREFIX`] (64).
    ///
    /// # Errors
    ///
    /// More than 128 bits ([`InvalidIpNet::PrefixLength`]).
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<Self, InvalidIpNet> {
        if bits > 128 {
            return Err(InvalidIpNet::PrefixLength);
        }
        self.ipv6_prefix = bits;
        Ok(self)
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
        let name = match self.header {
            ForwardedHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardedHeader::Forwarded => http::header::FORWARDED,
        };
        let mut client = peer;
        // Nearest proxy first: the last line, its last element.
        for line in headers.get_all(name).iter().rev() {
            let Ok(line) = line.to_str() else {
                return client;
            };
            for element in line.rsplit(',') {
                let hop = match self.header {
                    ForwardedHeader::XForwardedFor => parse_node(element.trim()),
                    ForwardedHeader::Forwarded => forwarded_for(element),
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
    fn default() -> Self {
        Self::socket_addr()
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

/// The longest header value [`header_value`] uses as a key: 256 bytes.
pub const MAX_HEADER_KEY_LEN: usize = 256;

/// A key extractor: the value of header `name` (the first line, as bytes), such as an API
/// key. A request without the header, or with a value longer than
/// [`MAX_HEADER_KEY_LEN`], has no key (and shares the unkeyed limit), so a long value
/// cannot grow memory.
///
/// The value is copied into the key; it is not kept as a [`http::HeaderValue`], which may
/// share (and so keep alive) the whole buffer the request head was read into.
pub fn header_value(
    name: HeaderName,
) -> impl Fn(&Parts) -> Option<Box<[u8]>> + Send + Sync + 'static {
    move |parts: &Parts| {
        let value = parts.headers.get(&name)?.as_bytes();
        (value.len() <= MAX_HEADER_KEY_LEN).then(|| value.into())
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
        assert_eq!(
            ClientIp::socket_addr().client_ip(&p),
            Some(ip("203.0.113.9"))
        );
        let p = parts("203.0.113.9:5000", &[("forwarded", "for=1.2.3.4")]);
        assert_eq!(ClientIp::default().client_ip(&p), Some(ip("203.0.113.9")));
    }

    #[test]
    fn x_forwarded_for_behind_trusted_proxies() {
        let c = ClientIp::socket_addr().trust_proxies(
            ForwardedHeader::XForwardedFor,
            ["10.0.0.0/8".parse().unwrap()],
        );
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
        let c = ClientIp::socket_addr()
            .trust_proxies(ForwardedHeader::Forwarded, ["10.0.0.1".parse().unwrap()]);
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
        let exact = ClientIp::default().ipv6_prefix(128).unwrap();
        assert_eq!(exact.client_ip(&p), Some(ip("2001:db8:1:2:3:4:5:6")));
        assert_eq!(
            ClientIp::default().ipv6_prefix(129).unwrap_err(),
            InvalidIpNet::PrefixLength
        );
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
            assert_eq!(
                bad.parse::<IpNet>(),
                Err(InvalidIpNet::PrefixLength),
                "{bad}"
            );
        }
        assert_eq!("nope/8".parse::<IpNet>(), Err(InvalidIpNet::Address));
    }

    #[test]
    fn header_keys() {
        let extract = header_value(HeaderName::from_static("x-api-key"));
        let p = parts("192.0.2.1:1", &[("x-api-key", "abc")]);
        assert_eq!(extract(&p).as_deref(), Some(&b"abc"[..]));
        assert_eq!(extract(&parts("192.0.2.1:1", &[])), None);
        let long = "k".repeat(MAX_HEADER_KEY_LEN + 1);
        assert_eq!(
            extract(&parts("192.0.2.1:1", &[("x-api-key", &long)])),
            None
        );
    }
}
