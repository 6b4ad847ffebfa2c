//! Who the client is behind a load balancer: the proxies a server trusts
//! ([`TrustedProxies`]), the header they write ([`ForwardedHeader`]), and the client address
//! resolved once for every layer of the server ([`ClientAddr`](super::ClientAddr),
//! [`client_addr`](super::client_addr)).
//!
//! Behind a balancer every request comes from the balancer's address, so a key built on the
//! peer address sees one caller. The balancer writes the client's address in a header
//! (`X-Forwarded-For`, or RFC 7239's `Forwarded`), but so can any client: a server may read
//! it only from a peer it trusts, and only the part that trusted peers wrote.
//!
//! The overload layer takes the setting
//! ([`OverloadSignalLayerBuilder::trusted_proxies`](super::OverloadSignalLayerBuilder::trusted_proxies),
//! or `ratelimit-layer`'s `OverloadProtectionLayerBuilder::trusted_proxies`), resolves each
//! request's client once, and leaves it in the request as a [`ClientAddr`](super::ClientAddr) for every layer
//! inside it: its own caller key ([`PeerIp`](super::PeerIp)) and `ratelimit-layer`'s
//! `ClientIp` (a per-client limit) both read it. One setting, so a team cannot trust the
//! balancer in the limiter and forget it in the overload layer.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use http::request::Parts;
use http::{Extensions, HeaderMap, HeaderName};
use overload_core::ConfigError;

use super::ip_net::IpNet;
use super::peer::{ClientAddr, peer_addr};

/// `X-Forwarded-For`, as proxies write it.
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The header that carries client addresses through trusted proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (de facto standard; addresses, possibly
    /// with a port). HAProxy's `option forwardfor`, nginx's `$proxy_add_x_forwarded_for`,
    /// Envoy and the cloud balancers write it.
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239); the `for` parameter of each element.
    Forwarded,
}

impl ForwardedHeader {
    /// The header's name.
    pub fn name(self) -> HeaderName {
        match self {
            Self::XForwardedFor => X_FORWARDED_FOR,
            Self::Forwarded => http::header::FORWARDED,
        }
    }
}

/// The proxies (load balancers) whose forwarding header a server believes, and which header
/// that is.
///
/// A request whose peer is one of the proxies has its client read from the header, right to
/// left (the nearest proxy writes last): each address that is itself a trusted proxy is
/// skipped, and the first one that is not is the client. A request from any other peer is
/// its own client, whatever headers it sends: anyone can write `X-Forwarded-For`, so a
/// header from an untrusted peer would let a client choose its own address. Only the one
/// header named is read. An element that cannot be read (`unknown`, an obfuscated
/// identifier, garbage) ends the walk at the last address read: nothing left of it was
/// written by a trusted proxy.
///
/// ```
/// use std::net::IpAddr;
///
/// use http::HeaderMap;
/// use overload_signal::signal::{ForwardedHeader, TrustedProxies};
///
/// let ip = |s: &str| s.parse::<IpAddr>().unwrap();
///
/// // A balancer at 10.0.0.2 that appends to X-Forwarded-For (HAProxy's `option forwardfor`).
/// let proxies = TrustedProxies::new(ForwardedHeader::XForwardedFor, ["10.0.0.2".parse()?])?;
/// let mut headers = HeaderMap::new();
/// // A client claimed 1.2.3.4; the balancer appended the address it saw.
/// headers.append("x-forwarded-for", "1.2.3.4".parse().unwrap());
/// headers.append("x-forwarded-for", "203.0.113.9".parse().unwrap());
/// assert_eq!(proxies.client(ip("10.0.0.2"), &headers), ip("203.0.113.9"));
/// // The same headers from anyone else are ignored.
/// assert_eq!(proxies.client(ip("192.0.2.1"), &headers), ip("192.0.2.1"));
/// # Ok::<(), overload_signal::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct TrustedProxies {
    inner: Arc<Inner>,
}

struct Inner {
    proxies: Box<[IpNet]>,
    header: ForwardedHeader,
    name: HeaderName,
}

impl TrustedProxies {
    /// The broadest network accepted, as a prefix length, for IPv4 and for IPv6 alike: 8
    /// (`10.0.0.0/8`, a 256th of IPv4; `fd00::/8`, a 256th of IPv6).
    ///
    /// The widest private ranges in use are of this size: `10.0.0.0/8` (RFC 1918) and
    /// `fd00::/8` (the locally assigned unique local addresses of RFC 4193; the other half
    /// of `fc00::/7` is not assigned). Proxies live in networks an organisation runs, so a
    /// broader network than the broadest private one is a network of other people's
    /// addresses, clients' among them: name the balancers' own networks instead.
    pub const MAX_NETWORK_PREFIX: u8 = 8;

    /// Trusts `proxies` to write the client's address in `header`.
    ///
    /// An IPv4-mapped IPv6 network counts as the IPv4 network it holds (see [`IpNet`]).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `proxies`:
    ///
    /// - of kind `OutOfRange` when no network is given (leave the setting out to trust no
    ///   one);
    /// - of kind `Invalid` when the networks, together, hold every IPv4 address or every
    ///   IPv6 address (`0.0.0.0/0`; `0.0.0.0/1` with `128.0.0.0/1`; `::/1` with
    ///   `8000::/1`; `::ffff:0:0/96`, which is all of IPv4): that trusts every peer,
    ///   clients included, so any client could choose its own address;
    /// - of kind `Invalid` for a network broader than a `/8`
    ///   ([`MAX_NETWORK_PREFIX`](Self::MAX_NETWORK_PREFIX) says why), naming it.
    ///
    /// ```
    /// use overload_signal::signal::{ForwardedHeader, TrustedProxies};
    ///
    /// let halves = ["0.0.0.0/1".parse()?, "128.0.0.0/1".parse()?];
    /// let err = TrustedProxies::new(ForwardedHeader::XForwardedFor, halves).unwrap_err();
    /// assert!(err.to_string().contains("every IPv4 address"));
    /// let private = ["10.0.0.0/8".parse()?, "fd00::/8".parse()?];
    /// assert!(TrustedProxies::new(ForwardedHeader::XForwardedFor, private).is_ok());
    /// # Ok::<(), overload_signal::ConfigError>(())
    /// ```
    pub fn new(
        header: ForwardedHeader,
        proxies: impl IntoIterator<Item = IpNet>,
    ) -> Result<Self, ConfigError> {
        let proxies: Box<[IpNet]> = proxies.into_iter().collect();
        if proxies.is_empty() {
            return Err(ConfigError::out_of_range(
                "proxies",
                0,
                "at least one network (leave the setting out to trust no proxy)",
            ));
        }
        if let Some(everyone) = proxies.iter().find(|net| net.prefix() == 0) {
            return Err(ConfigError::invalid(
                "proxies",
                &everyone.to_string(),
                "a network that leaves clients out: trusting every address lets any client \
                 choose its own",
            ));
        }
        if let Some(family) = covered_family(&proxies) {
            let list = proxies
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ConfigError::invalid(
                "proxies",
                &list,
                &format!(
                    "networks that leave clients out: together these hold every {family} \
                     address, and trusting every address lets any client choose its own"
                ),
            ));
        }
        if let Some(broad) = proxies
            .iter()
            .find(|net| net.prefix() < Self::MAX_NETWORK_PREFIX)
        {
            return Err(ConfigError::invalid(
                "proxies",
                &broad.to_string(),
                "networks no broader than a /8 (the widest private ranges are 10.0.0.0/8 \
                 and fd00::/8): a broader one holds other people's addresses, clients' among \
                 them; name the balancers' own networks",
            ));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                proxies,
                header,
                name: header.name(),
            }),
        })
    }

    /// The header read.
    pub fn header(&self) -> ForwardedHeader {
        self.inner.header
    }

    /// The trusted networks.
    pub fn proxies(&self) -> &[IpNet] {
        &self.inner.proxies
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.inner.proxies.iter().any(|net| net.contains(ip))
    }

    /// The client of a request from `peer` with `headers`: `peer` itself unless it is a
    /// trusted proxy, else the first address that is not, reading the header right to left.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer.to_canonical();
        if !self.is_trusted(client) {
            return client;
        }
        let forwarded = self.inner.header == ForwardedHeader::Forwarded;
        // Nearest proxy first: the last line, its last element.
        for line in headers.get_all(&self.inner.name).iter().rev() {
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

    /// The client of a request, from its peer address ([`peer_addr`]) and its headers;
    /// `None` when the request has no peer address.
    pub fn client_of(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = peer_addr(&parts.extensions)?;
        Some(self.client(peer.ip(), &parts.headers))
    }

    /// Resolves the request's client and leaves it in its extensions as a [`ClientAddr`],
    /// when the request came through a trusted proxy (a direct peer is its own client, which
    /// [`client_addr`](super::client_addr) finds without an extension, so nothing is inserted).
    pub fn resolve(&self, parts: &mut Parts) {
        if let Some(client) = self.resolved(&parts.headers, &parts.extensions) {
            parts.extensions.insert(client);
        }
    }

    /// What [`resolve`](Self::resolve) inserts in the extensions of a request with these
    /// `headers` and `extensions`, if anything.
    #[inline]
    pub(crate) fn resolved(
        &self,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> Option<ClientAddr> {
        let peer = peer_addr(extensions)?.ip().to_canonical();
        self.is_trusted(peer)
            .then(|| ClientAddr::new(self.client(peer, headers)))
    }
}

impl fmt::Debug for TrustedProxies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustedProxies")
            .field("header", &self.inner.header)
            .field("proxies", &self.inner.proxies)
            .finish()
    }
}

impl PartialEq for TrustedProxies {
    fn eq(&self, other: &Self) -> bool {
        self.inner.header == other.inner.header && self.inner.proxies == other.inner.proxies
    }
}

impl Eq for TrustedProxies {}

/// The family (`"IPv4"` or `"IPv6"`) every address of which `nets` hold together, if any.
/// An IPv6 network that holds every IPv4-mapped address holds all of IPv4.
fn covered_family(nets: &[IpNet]) -> Option<&'static str> {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for net in nets {
        if net.addr().is_ipv4() {
            v4.push(net.range());
        } else {
            v6.push(net.range());
            if net.holds_every_ipv4_mapped() {
                v4.push((0, u128::from(u32::MAX)));
            }
        }
    }
    if covers(v4, u128::from(u32::MAX)) {
        Some("IPv4")
    } else if covers(v6, u128::MAX) {
        Some("IPv6")
    } else {
        None
    }
}

/// Whether the ranges `(first, last)`, together, hold every number of `0..=max`.
fn covers(mut ranges: Vec<(u128, u128)>, max: u128) -> bool {
    ranges.sort_unstable();
    // The first number not held yet; `None` once `max` is held.
    let mut next = Some(0u128);
    for (first, last) in ranges {
        let Some(n) = next else { break };
        if first > n {
            return false;
        }
        if last >= n {
            next = if last >= max { None } else { Some(last + 1) };
        }
    }
    next.is_none()
}

/// The `for` parameter of one `Forwarded` element, as an address.
pub(crate) fn forwarded_for(element: &str) -> Option<IpAddr> {
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
pub(crate) fn parse_node(s: &str) -> Option<IpAddr> {
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

#[cfg(test)]
mod tests {
    use crate::signal::client_addr;
    use std::net::SocketAddr;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(name: &str, lines: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for line in lines {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                line.parse().unwrap(),
            );
        }
        h
    }

    fn xff(proxies: &[&str]) -> TrustedProxies {
        TrustedProxies::new(
            ForwardedHeader::XForwardedFor,
            proxies.iter().map(|p| p.parse().unwrap()),
        )
        .unwrap()
    }

    #[test]
    fn only_a_trusted_peer_s_header_is_read() {
        let p = xff(&["10.0.0.0/8"]);
        let h = headers("x-forwarded-for", &["203.0.113.1"]);
        assert_eq!(p.client(ip("10.1.1.1"), &h), ip("203.0.113.1"));
        // The same header from an untrusted peer: the peer is the client.
        assert_eq!(p.client(ip("192.0.2.9"), &h), ip("192.0.2.9"));
        // A trusted peer without the header is its own client.
        assert_eq!(p.client(ip("10.1.1.1"), &HeaderMap::new()), ip("10.1.1.1"));
    }

    #[test]
    fn the_walk_goes_right_to_left_skipping_trusted_hops() {
        let p = xff(&["10.0.0.0/8", "2001:db8::/32"]);
        // client, then two trusted hops, in one line and across lines.
        let one = headers("x-forwarded-for", &["198.51.100.1, 1.2.3.4, 10.0.0.5"]);
        assert_eq!(p.client(ip("10.0.0.1"), &one), ip("1.2.3.4"));
        let lines = headers(
            "x-forwarded-for",
            &["198.51.100.1", "1.2.3.4:5678", "[2001:db8::1]:80"],
        );
        assert_eq!(p.client(ip("10.0.0.1"), &lines), ip("1.2.3.4"));
        // Every hop trusted: the leftmost one.
        let all = headers("x-forwarded-for", &["10.9.9.9, 10.0.0.5"]);
        assert_eq!(p.client(ip("10.0.0.1"), &all), ip("10.9.9.9"));
        // Garbage ends the walk at the last address read.
        let junk = headers("x-forwarded-for", &["1.2.3.4, nonsense, 10.0.0.5"]);
        assert_eq!(p.client(ip("10.0.0.1"), &junk), ip("10.0.0.5"));
        // IPv4-mapped addresses count as IPv4, for the peer and for hops.
        let mapped = headers("x-forwarded-for", &["::ffff:203.0.113.4"]);
        assert_eq!(p.client(ip("::ffff:10.0.0.1"), &mapped), ip("203.0.113.4"));
    }

    #[test]
    fn forwarded_reads_the_for_parameter() {
        let p =
            TrustedProxies::new(ForwardedHeader::Forwarded, ["10.0.0.1".parse().unwrap()]).unwrap();
        let h = headers(
            "forwarded",
            &[r#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711""#],
        );
        assert_eq!(p.client(ip("10.0.0.1"), &h), ip("2001:db8:cafe::17"));
        let hidden = headers("forwarded", &["for=192.0.2.60, for=_hidden"]);
        assert_eq!(p.client(ip("10.0.0.1"), &hidden), ip("10.0.0.1"));
        // X-Forwarded-For is not read when Forwarded is the header.
        let other = headers("x-forwarded-for", &["192.0.2.60"]);
        assert_eq!(p.client(ip("10.0.0.1"), &other), ip("10.0.0.1"));
    }

    #[test]
    fn settings_that_trust_no_one_or_everyone_are_refused() {
        let none = TrustedProxies::new(ForwardedHeader::XForwardedFor, []).unwrap_err();
        assert_eq!(none.field(), "proxies");
        assert!(none.to_string().contains("at least one network"), "{none}");
        for everyone in ["0.0.0.0/0", "::/0"] {
            let err = TrustedProxies::new(
                ForwardedHeader::XForwardedFor,
                ["10.0.0.0/8".parse().unwrap(), everyone.parse().unwrap()],
            )
            .unwrap_err();
            assert_eq!(err.field(), "proxies");
            assert!(err.to_string().contains("any client"), "{err}");
        }
    }

    fn trust(nets: &[&str]) -> Result<TrustedProxies, ConfigError> {
        TrustedProxies::new(
            ForwardedHeader::XForwardedFor,
            nets.iter().map(|n| n.parse::<IpNet>().unwrap()),
        )
    }

    /// Regression (issue 31, finding 6): `/0` was refused, but two halves (or four
    /// quarters) that cover every address were accepted: the same "trust everyone", which
    /// lets any client write its own address in `X-Forwarded-For`.
    #[test]
    fn every_address_in_pieces_is_refused() {
        for everyone in [
            &["0.0.0.0/1", "128.0.0.0/1"][..],
            &["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/2", "192.0.0.0/2"],
            &["::/1", "8000::/1"],
            // All of IPv4, written as IPv4-mapped IPv6.
            &["::ffff:0:0/96"],
            &["::ffff:0:0/97", "::ffff:128.0.0.0/97"],
            &["::ffff:0.0.0.0/97", "128.0.0.0/1"],
        ] {
            let err = trust(everyone).unwrap_err();
            assert_eq!(err.field(), "proxies", "{everyone:?}");
            assert!(
                err.to_string().contains("any client"),
                "{everyone:?}: {err}"
            );
        }
        // Every /8 of IPv4, each within the bound on one network: together, everyone.
        let slash_8s: Vec<String> = (0..=255).map(|i| format!("{i}.0.0.0/8")).collect();
        let slash_8s: Vec<&str> = slash_8s.iter().map(String::as_str).collect();
        let err = trust(&slash_8s).unwrap_err();
        assert!(err.to_string().contains("every IPv4 address"), "{err}");
        // An IPv6 network that holds every IPv4-mapped address holds all of IPv4.
        let err = trust(&["::/8"]).unwrap_err();
        assert!(err.to_string().contains("every IPv4 address"), "{err}");
        // Half of everything is refused too, by the bound on one network.
        let err = trust(&["8000::/1"]).unwrap_err();
        assert!(err.to_string().contains("no broader than"), "{err}");
    }

    /// Issue 31, finding 6: a network broader than an IPv4 /8 or an IPv6 /8 is refused
    /// with a message that names it and the widest private ranges.
    #[test]
    fn a_network_broader_than_a_slash_8_is_refused() {
        for broad in [
            "0.0.0.0/1",
            "11.0.0.0/7",
            "2000::/3",
            "fc00::/7",
            "4000::/2",
        ] {
            let err = trust(&["10.0.0.2", broad]).unwrap_err();
            assert_eq!(err.field(), "proxies", "{broad}");
            assert_eq!(err.kind(), overload_core::ConfigErrorKind::Invalid);
            assert!(
                err.to_string()
                    .contains(&format!("got \"{}\"", broad.parse::<IpNet>().unwrap())),
                "{broad}: {err}"
            );
            assert!(err.to_string().contains("10.0.0.0/8"), "{err}");
            assert!(err.to_string().contains("fd00::/8"), "{err}");
        }
    }

    #[test]
    fn ordinary_private_sets_are_accepted() {
        for ordinary in [
            &["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"][..],
            &["fd00::/8", "fe80::/10", "::1", "127.0.0.0/8"],
            &["100.64.0.0/10", "2001:db8::/32"],
            &["10.0.0.2"],
            &["::ffff:10.0.0.0/104"],
        ] {
            let proxies = trust(ordinary).unwrap_or_else(|e| panic!("{ordinary:?}: {e}"));
            assert!(!proxies.is_trusted(ip("203.0.113.1")), "{ordinary:?}");
            assert!(!proxies.is_trusted(ip("2001:4860::1")), "{ordinary:?}");
        }
        // The IPv4-mapped form is the IPv4 network it holds.
        let mapped = trust(&["::ffff:10.0.0.0/104"]).unwrap();
        assert_eq!(mapped.proxies(), &["10.0.0.0/8".parse::<IpNet>().unwrap()]);
        assert!(mapped.is_trusted(ip("10.9.9.9")));
    }

    #[test]
    fn resolve_leaves_the_client_in_the_request_only_through_a_proxy() {
        let p = xff(&["10.0.0.2"]);
        let request = |peer: &str| {
            let mut req = http::Request::builder()
                .header("x-forwarded-for", "203.0.113.5")
                .body(())
                .unwrap();
            req.extensions_mut()
                .insert(peer.parse::<SocketAddr>().unwrap());
            req.into_parts().0
        };
        let mut through = request("10.0.0.2:40000");
        p.resolve(&mut through);
        assert_eq!(
            through.extensions.get::<ClientAddr>(),
            Some(&ClientAddr::new(ip("203.0.113.5")))
        );
        assert_eq!(client_addr(&through.extensions), Some(ip("203.0.113.5")));
        assert_eq!(p.client_of(&through), Some(ip("203.0.113.5")));
        let mut direct = request("192.0.2.3:40000");
        p.resolve(&mut direct);
        assert_eq!(direct.extensions.get::<ClientAddr>(), None);
        assert_eq!(client_addr(&direct.extensions), Some(ip("192.0.2.3")));
        // No peer address: nothing to resolve.
        let mut none = http::Request::new(()).into_parts().0;
        p.resolve(&mut none);
        assert_eq!(client_addr(&none.extensions), None);
        assert_eq!(p.client_of(&none), None);
    }
}
