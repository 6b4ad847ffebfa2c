//! Where a request's peer address is: a plain `SocketAddr` extension, whichever server
//! accepted it ([`peer_addr`]), and the default caller key built on it and on the client address resolved behind trusted proxies
//! ([`PeerIp`]).

use std::hash::Hasher;
use std::net::{IpAddr, SocketAddr};

use http::Extensions;
use http::request::Parts;

use super::callers::CallerKey;
use super::ip_net::mask;

/// The address of the connection's peer: the [`SocketAddr`] the server put in the request's
/// extensions.
///
/// The one place every layer of this workspace reads the peer from (through
/// [`client_addr`], which prefers a resolved [`ClientAddr`]), whatever the framework: a plain
/// contract, which no framework upgrade can break. Frameworks keep the peer in types of
/// their own; the adapters copy it here (see [the peer address](super#the-peer-address)):
///
/// - axum 0.8: serve with `overload_signal::axum_0_8::into_make_service_with_peer_addr(app)`
///   (feature `axum-0_8`), in place of `app.into_make_service_with_connect_info::<SocketAddr>()`;
/// - tonic 0.14 (plain TCP or TLS): build the server with
///   `overload_signal::tonic_0_14::server_builder()` (feature `tonic-0_14`), in place of
///   `Server::builder()`;
/// - any other server (hyper, another major version of axum or tonic): insert the peer's
///   `SocketAddr` in each request's extensions, outside the layers.
///
/// `None` without it: a layer keyed by the peer then says so at `ERROR`, with the fix, at its
/// first such request.
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use overload_signal::signal::peer_addr;
///
/// let mut request = Request::new(());
/// assert_eq!(peer_addr(request.extensions()), None);
/// let peer: SocketAddr = "192.0.2.7:50000".parse().unwrap();
/// request.extensions_mut().insert(peer);
/// assert_eq!(peer_addr(request.extensions()), Some(peer));
/// ```
#[inline]
pub fn peer_addr(extensions: &Extensions) -> Option<SocketAddr> {
    extensions.get::<SocketAddr>().copied()
}

/// The client address of a request, as the server resolved it: put in the request's
/// extensions by a layer that knows it, read by every caller key and client key after it.
///
/// The overload layer inserts it when it is set up with [`TrustedProxies`](super::TrustedProxies) and the request
/// came through one of them. Insert it yourself when the client address comes from
/// elsewhere (the PROXY protocol, a sidecar that terminates TLS): [`client_addr`] then
/// returns it, so the overload layer's default caller key and `ratelimit-layer`'s `ClientIp`
/// key by it. Only server code can insert an extension; a client cannot send one.
///
/// ```
/// use http::Request;
/// use overload_signal::signal::{ClientAddr, client_addr};
///
/// let mut request = Request::new(());
/// request.extensions_mut().insert(ClientAddr::new("198.51.100.7".parse().unwrap()));
/// assert_eq!(client_addr(request.extensions()), Some("198.51.100.7".parse().unwrap()));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientAddr(IpAddr);

impl ClientAddr {
    /// The client at `ip` (an IPv4-mapped IPv6 address is kept as the IPv4 address).
    pub const fn new(ip: IpAddr) -> Self {
        Self(ip.to_canonical())
    }

    /// The client's address.
    pub const fn ip(&self) -> IpAddr {
        self.0
    }
}

/// The address of the request's client: the [`ClientAddr`] a layer resolved (through
/// [`TrustedProxies`](super::TrustedProxies), or put there by your own code), or else the IP address of the
/// connection's peer ([`peer_addr`]); `None` without either.
///
/// What the overload layer's default caller key ([`PeerIp`](super::PeerIp)) and
/// `ratelimit-layer`'s `ClientIp` read.
#[inline]
pub fn client_addr(extensions: &Extensions) -> Option<IpAddr> {
    if let Some(client) = extensions.get::<ClientAddr>() {
        return Some(client.0);
    }
    peer_addr(extensions).map(|peer| peer.ip().to_canonical())
}

/// The default caller key: the network of the client's IP address ([`client_addr`]): the
/// one resolved behind a trusted load balancer (a [`ClientAddr`](super::ClientAddr) the layer
/// leaves in the request when it is set up with
/// [`trusted_proxies`](super::OverloadSignalLayerBuilder::trusted_proxies)), or else the
/// connection's peer, from the `SocketAddr` extension the server put there ([`peer_addr`],
/// which says how axum and tonic servers put it there). A request with neither has no key;
/// the layer counts such requests and logs them at `ERROR` with the fix (see
/// [the peer address](super#the-peer-address) and [`CallerKey`]).
///
/// **Callers are networks, not addresses**: an IPv4 client is keyed by its `/24`
/// ([`PeerIp::IPV4_PREFIX`]), an IPv6 client by its `/48` ([`PeerIp::IPV6_PREFIX`]), and an
/// IPv4-mapped IPv6 address as IPv4. Addresses cost an attacker little: a cloud account
/// rents a handful in one `/24`, and one IPv6 host holds a `/64` of them, a tunnel broker
/// hands out a `/48` for free. Keyed by address, seven addresses were seven callers, enough
/// to forge a storm past the default 5 % rule; keyed by network, they are one caller, whose
/// weight the layer bounds (see the [threat model](crate::signal#trust-what-callers-can-and-cannot-do)).
/// The cost is on the honest side: the clients of one network (an office behind a NAT, one
/// site's hosts) are one caller class, which is also what they are to an attacker. Behind a
/// load balancer every request has the balancer's address: trust the balancer
/// ([`TrustedProxies`](super::TrustedProxies)) and this key follows the client address it
/// forwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerIp;

impl PeerIp {
    /// The prefix IPv4 clients are keyed by: 24 bits, the smallest network the Internet
    /// routes, and the block a cloud provider's or hosting company's addresses come in.
    pub const IPV4_PREFIX: u8 = 24;

    /// The prefix IPv6 clients are keyed by: 48 bits, a site's allocation (RFC 6177), which
    /// anyone can get for free from a tunnel broker; a `/56` would let one such site be 256
    /// callers.
    pub const IPV6_PREFIX: u8 = 48;

    /// The client address of a request ([`client_addr`]: resolved behind trusted proxies,
    /// else the peer's), masked to its network ([`PeerIp::network`]), or `None` without one.
    pub fn peer_ip(parts: &Parts) -> Option<IpAddr> {
        client_addr(&parts.extensions).map(Self::network)
    }

    /// The network `ip` belongs to as a caller: its `/24` for IPv4 (an IPv4-mapped IPv6
    /// address counts as IPv4), its `/48` for IPv6. `ratelimit-layer`'s `ClientIp` hashes
    /// its caller key through it too, so the overload layer sees the same callers whichever
    /// key it is given.
    ///
    /// ```
    /// use overload_signal::signal::PeerIp;
    ///
    /// let network = |ip: &str| PeerIp::network(ip.parse().unwrap()).to_string();
    /// assert_eq!(network("192.0.2.77"), "192.0.2.0");
    /// assert_eq!(network("::ffff:192.0.2.77"), "192.0.2.0");
    /// assert_eq!(network("2001:db8:aa:bb:cc::1"), "2001:db8:aa::");
    /// ```
    #[inline]
    pub fn network(ip: IpAddr) -> IpAddr {
        match ip.to_canonical() {
            v4 @ IpAddr::V4(_) => mask(v4, Self::IPV4_PREFIX),
            v6 @ IpAddr::V6(_) => mask(v6, Self::IPV6_PREFIX),
        }
    }

    /// The one word [`CallerKey`] writes for the network of `ip`: distinct for distinct
    /// networks, IPv4 and IPv6 apart. For a key of your own that should class callers as
    /// this one does.
    #[inline]
    pub fn network_word(ip: IpAddr) -> u128 {
        ip_word(Self::network(ip))
    }
}

// NOTE: masked IPv6 addresses end in a zero bit, which `ip_word` relies on.
const _: () = assert!(PeerIp::IPV6_PREFIX < 128 && PeerIp::IPV4_PREFIX <= 32);

/// One word per key of [`PeerIp::peer_ip`], distinct for distinct keys: an IPv4 network
/// shifted left with its lowest bit set, an IPv6 network (masked to its /48, so its lowest
/// bit is clear) as it is. One write to the hasher, where `IpAddr`'s `Hash` makes three
/// through `dyn Hasher`, on every request.
const fn ip_word(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => ((v4.to_bits() as u128) << 1) | 1,
        IpAddr::V6(v6) => v6.to_bits(),
    }
}

impl PeerIp {
    /// What [`hash_key`](CallerKey::hash_key) writes, from the request's extensions: the one
    /// word of its client's network, or nothing (`false`) without a client address.
    #[inline]
    pub(crate) fn hash_extensions<H: Hasher + ?Sized>(
        extensions: &Extensions,
        state: &mut H,
    ) -> bool {
        match client_addr(extensions) {
            Some(ip) => {
                state.write_u128(ip_word(Self::network(ip)));
                true
            }
            None => false,
        }
    }
}

impl CallerKey for PeerIp {
    #[inline]
    fn hash_key(&self, parts: &Parts, state: &mut dyn Hasher) -> bool {
        Self::hash_extensions(&parts.extensions, state)
    }
}

#[cfg(test)]
mod tests {
    use std::hash::DefaultHasher;

    use super::*;

    fn parts(addr: Option<&str>) -> Parts {
        let mut req = http::Request::new(());
        if let Some(a) = addr {
            req.extensions_mut()
                .insert(a.parse::<SocketAddr>().unwrap());
        }
        req.into_parts().0
    }

    #[test]
    fn peer_ip_reads_the_socket_address_and_keeps_its_network() {
        assert_eq!(PeerIp::peer_ip(&parts(None)), None);
        assert_eq!(
            PeerIp::peer_ip(&parts(Some("192.0.2.7:443"))),
            Some("192.0.2.0".parse().unwrap())
        );
        assert_eq!(
            PeerIp::peer_ip(&parts(Some("[2001:db8:1:2:3:4:5:6]:443"))),
            Some("2001:db8:1::".parse().unwrap())
        );
        assert_eq!(
            PeerIp::peer_ip(&parts(Some("[::ffff:192.0.2.1]:443"))),
            Some("192.0.2.0".parse().unwrap())
        );
        let mut h = DefaultHasher::new();
        assert!(!PeerIp.hash_key(&parts(None), &mut h));
        assert!(PeerIp.hash_key(&parts(Some("192.0.2.7:1")), &mut h));
    }

    #[test]
    fn ipv4_and_ipv6_keys_never_share_a_word() {
        // What `hash_key` writes: the key of `peer_ip`, its network. IPv4 words
        // are odd, IPv6 networks' even, and each family's words are its addresses' bits.
        let key = |addr: &str| PeerIp::peer_ip(&parts(Some(addr))).unwrap();
        for v6 in [
            "[::]:1",
            "[::1]:1",
            "[2001:db8::ffff:1]:1",
            "[ffff:ffff:ffff:ffff::1]:1",
        ] {
            assert_eq!(ip_word(key(v6)) & 1, 0, "{v6}");
        }
        for v4 in ["0.0.0.0:1", "192.0.2.7:1", "255.255.255.255:1"] {
            assert_eq!(ip_word(key(v4)) & 1, 1, "{v4}");
        }
        assert_ne!(ip_word(key("0.0.0.0:1")), ip_word(key("[::]:1")));
        assert_ne!(ip_word(key("192.0.2.7:1")), ip_word(key("192.0.3.7:1")));
        assert_ne!(
            ip_word(key("[2001:db8:1::1]:1")),
            ip_word(key("[2001:db8:2::1]:1"))
        );
        // Two addresses of one /24, or two /64s of one /48, are one key.
        assert_eq!(ip_word(key("192.0.2.7:1")), ip_word(key("192.0.2.8:1")));
        assert_eq!(
            ip_word(key("[2001:db8:0:1::1]:1")),
            ip_word(key("[2001:db8:0:ffff::2]:1"))
        );
        assert_eq!(
            PeerIp::network_word("192.0.2.200".parse().unwrap()),
            ip_word(key("192.0.2.7:1"))
        );
    }

    #[test]
    fn a_resolved_client_address_wins_over_the_peer() {
        let mut p = parts(Some("10.0.0.2:40000"));
        assert_eq!(PeerIp::peer_ip(&p), Some("10.0.0.0".parse().unwrap()));
        p.extensions
            .insert(ClientAddr::new("2001:db8:1:2:3::9".parse().unwrap()));
        assert_eq!(PeerIp::peer_ip(&p), Some("2001:db8:1::".parse().unwrap()));
    }
}
