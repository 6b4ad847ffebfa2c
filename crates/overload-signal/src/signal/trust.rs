//! Whose word the server layers take: [`Trust`], the one setting that decides whose attempt
//! counters the overload layer counts and whose send times the deadline layer believes.
//!
//! A client writes `X-Request-Attempt` and `X-Request-Deadline` itself, and nothing
//! authenticates them. A counter that says "retry" from a caller on the Internet may be a
//! lie meant to make the server tell everyone to stop; a send time in next year may be a lie
//! meant to page the operator about clock skew. The layers therefore read both fields only
//! from callers they trust, and treat everyone else's claim to be a retry as no counter at
//! all (a first try stays a first try: it can only dilute the retry share) and its deadline
//! as one without a send time (its `timeout` counted from arrival, which can only shorten
//! that caller's own request).
//!
//! # The default: callers on private networks
//!
//! [`Trust::private_networks`], what [`Trust::default`] returns, trusts a request when its
//! client address ([`client_addr`]: the one [`TrustedProxies`](crate::signal::TrustedProxies)
//! resolved, or else the connection's peer) is on a network the Internet cannot route to
//! this server:
//!
//! | network | what |
//! |---|---|
//! | `127.0.0.0/8`, `::1` | this host |
//! | `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16` | private IPv4 (RFC 1918) |
//! | `100.64.0.0/10` | shared address space (RFC 6598), used by some Kubernetes networks |
//! | `169.254.0.0/16`, `fe80::/10` | link-local |
//! | `fc00::/7` | unique local IPv6 (RFC 4193) |
//!
//! and, when the request reached the server through a proxy that nobody told the layers to
//! trust (it carries `X-Forwarded-For`, `Forwarded` or `X-Real-IP` and no address was
//! resolved from them), every address those fields name is on such a network too. So:
//!
//! - **Inside a private network** (services calling each other, a mesh of sidecars, the
//!   README's demos on 127.0.0.1), every caller is trusted without a line of configuration;
//! - **On the Internet**, no client's counter or send time counts, whether it connects
//!   directly or through a load balancer that appends the address it saw to
//!   `X-Forwarded-For` (a client cannot make itself look private: its own address is in the
//!   field). Trust the balancer with
//!   [`trusted_proxies`](crate::OverloadSignalLayerBuilder::trusted_proxies), and the
//!   address it forwards decides.
//! - A request without any client address (a server that does not put the peer in the
//!   request's extensions) is not trusted.
//!
//! What it cannot see: a load balancer that hides the client's address altogether (a TCP
//! balancer without the PROXY protocol, on a private address) makes every client look like a
//! private caller. Behind one, pass [`Trust::nobody`], or resolve the client address
//! yourself and insert it as a [`ClientAddr`].
//!
//! # Choosing another
//!
//! ```
//! use overload_signal::Trust;
//! use overload_signal::signal::IpNet;
//!
//! // A public API: no caller's counters or send times count.
//! let public = Trust::nobody();
//! // A fleet whose callers all run in 10.20.0.0/16.
//! let fleet = Trust::networks([IpNet::new([10, 20, 0, 0].into(), 16)?]);
//! // Callers that presented a client certificate (an extension your TLS acceptor inserts).
//! #[derive(Clone)]
//! struct PeerCertificate;
//! let mtls = Trust::when(|_headers, extensions| extensions.get::<PeerCertificate>().is_some());
//! # drop((public, fleet, mtls));
//! # Ok::<(), overload_core::ConfigError>(())
//! ```
//!
//! Set it once, on `ratelimit-layer`'s `OverloadProtectionLayer` (which passes it to the
//! overload and deadline layers it holds), or on each layer's builder:
//! [`OverloadSignalLayerBuilder::trust`](crate::OverloadSignalLayerBuilder::trust),
//! [`DeadlineLayerBuilder::trust`](crate::DeadlineLayerBuilder::trust).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use http::header::{FORWARDED, HeaderName};
use http::{Extensions, HeaderMap};

use super::ip_net::IpNet;
use super::peer::{ClientAddr, client_addr};
use super::proxies::{X_FORWARDED_FOR, forwarded_for, parse_node};

/// `X-Real-IP`, as nginx writes it.
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// A predicate of [`Trust::when`]: the request's headers and extensions.
type TrustFn = dyn Fn(&HeaderMap, &Extensions) -> bool + Send + Sync;

/// Whose attempt counters and deadlines' send times the server layers believe. See the
/// [module docs](crate::signal::trust) for what each choice means and the default's reasoning.
///
/// Cheap to clone. Default: [`Trust::private_networks`].
#[derive(Clone)]
pub struct Trust(Kind);

#[derive(Clone)]
enum Kind {
    PrivateNetworks,
    Everyone,
    Nobody,
    Networks(Arc<[IpNet]>),
    When(Arc<TrustFn>),
}

impl Trust {
    /// Callers whose client address is on a private, loopback, link-local or shared network,
    /// and who did not come through a proxy from anywhere else: the default. The
    /// [module docs](crate::signal::trust#the-default-callers-on-private-networks) list the
    /// networks and say what it sees and what it cannot.
    pub const fn private_networks() -> Self {
        Self(Kind::PrivateNetworks)
    }

    /// Every caller: what the layers did before this setting existed. For a server no one
    /// outside your organisation reaches, behind a load balancer that hides client
    /// addresses; a caller that lies can then forge retry pressure and clock skew, within
    /// the bounds the overload layer's caller classes set.
    pub const fn everyone() -> Self {
        Self(Kind::Everyone)
    }

    /// No caller: the overload layer never reads an attempt counter (so it never answers
    /// with the stop signal on a retry storm it cannot see, only on a downstream's signal),
    /// and the deadline layer counts every deadline from arrival.
    pub const fn nobody() -> Self {
        Self(Kind::Nobody)
    }

    /// Callers whose client address ([`client_addr`]) is in one of `networks`. No network
    /// trusts nobody.
    pub fn networks(networks: impl IntoIterator<Item = IpNet>) -> Self {
        Self(Kind::Networks(networks.into_iter().collect()))
    }

    /// Callers for which `predicate` returns `true`, given the request's headers and
    /// extensions: an mTLS identity your acceptor inserted, a header your own load
    /// balancer sets and strips from what clients send.
    pub fn when<F>(predicate: F) -> Self
    where
        F: Fn(&HeaderMap, &Extensions) -> bool + Send + Sync + 'static,
    {
        Self(Kind::When(Arc::new(predicate)))
    }

    /// Whether a request with these headers and extensions comes from a trusted caller.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use http::Request;
    /// use overload_signal::Trust;
    ///
    /// let from = |peer: &str, forwarded: Option<&str>| {
    ///     let mut request = Request::new(());
    ///     request.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
    ///     if let Some(f) = forwarded {
    ///         request.headers_mut().insert("x-forwarded-for", f.parse().unwrap());
    ///     }
    ///     Trust::default().trusts(request.headers(), request.extensions())
    /// };
    /// assert!(from("10.1.2.3:5000", None));
    /// assert!(!from("203.0.113.9:5000", None));
    /// // Through a proxy nobody trusted, on behalf of an Internet client.
    /// assert!(!from("10.1.2.3:5000", Some("198.51.100.7")));
    /// // A client that claims to be private through that proxy: its own address is there.
    /// assert!(!from("10.1.2.3:5000", Some("10.0.0.1, 198.51.100.7")));
    /// // A mesh's sidecar, forwarding for another pod.
    /// assert!(from("127.0.0.1:5000", Some("10.4.0.17")));
    /// ```
    #[inline]
    pub fn trusts(&self, headers: &HeaderMap, extensions: &Extensions) -> bool {
        match &self.0 {
            Kind::Everyone => true,
            Kind::Nobody => false,
            Kind::PrivateNetworks => private_caller(headers, extensions),
            Kind::Networks(networks) => client_addr(extensions)
                .is_some_and(|ip| networks.iter().any(|net| net.contains(ip))),
            Kind::When(predicate) => predicate(headers, extensions),
        }
    }
}

impl Default for Trust {
    /// [`Trust::private_networks`].
    fn default() -> Self {
        Self::private_networks()
    }
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::PrivateNetworks => f.write_str("Trust::private_networks()"),
            Kind::Everyone => f.write_str("Trust::everyone()"),
            Kind::Nobody => f.write_str("Trust::nobody()"),
            Kind::Networks(networks) => f.debug_tuple("Trust::networks").field(networks).finish(),
            Kind::When(_) => f.write_str("Trust::when(..)"),
        }
    }
}

/// The default's rule: a private client address and, through a proxy nobody trusted, only
/// private addresses in its forwarding fields.
#[inline]
fn private_caller(headers: &HeaderMap, extensions: &Extensions) -> bool {
    if let Some(client) = extensions.get::<ClientAddr>() {
        // NOTE: resolved by trusted proxies (or by the application): the forwarding fields
        // were read already, and what they said is this address.
        return is_private(client.ip());
    }
    let Some(peer) = client_addr(extensions) else {
        return false;
    };
    if !is_private(peer) {
        return false;
    }
    if headers.contains_key(&X_FORWARDED_FOR)
        || headers.contains_key(FORWARDED)
        || headers.contains_key(&X_REAL_IP)
    {
        return forwarded_all_private(headers);
    }
    true
}

/// Whether every address in the request's forwarding fields is private (a field or an
/// element that does not read as an address is not).
#[cold]
fn forwarded_all_private(headers: &HeaderMap) -> bool {
    let plain = |name: &HeaderName| {
        headers.get_all(name).iter().all(|line| {
            line.to_str().is_ok_and(|line| {
                line.split(',')
                    .all(|element| parse_node(element.trim()).is_some_and(is_private))
            })
        })
    };
    let forwarded = headers.get_all(FORWARDED).iter().all(|line| {
        line.to_str().is_ok_and(|line| {
            line.split(',')
                .all(|element| forwarded_for(element).is_some_and(is_private))
        })
    });
    plain(&X_FORWARDED_FOR) && plain(&X_REAL_IP) && forwarded
}

/// Whether `ip` is on a network the Internet does not route: loopback, private (RFC 1918),
/// shared (RFC 6598), link-local, unique local IPv6.
pub(crate) fn is_private(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => is_private_v4(v4),
        IpAddr::V6(v6) => is_private_v6(v6),
    }
}

const fn is_private_v4(v4: Ipv4Addr) -> bool {
    let [a, b, ..] = v4.octets();
    v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        // NOTE: 100.64.0.0/10.
        || (a == 100 && b & 0xC0 == 64)
}

const fn is_private_v6(v6: Ipv6Addr) -> bool {
    let first = v6.segments()[0];
    v6.is_loopback() || first & 0xFE00 == 0xFC00 || first & 0xFFC0 == 0xFE80
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn request(peer: Option<&str>, headers: &[(&str, &str)]) -> http::Request<()> {
        let mut request = http::Request::new(());
        if let Some(peer) = peer {
            request
                .extensions_mut()
                .insert(peer.parse::<SocketAddr>().unwrap());
        }
        for (name, value) in headers {
            request.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        request
    }

    fn default_trusts(peer: Option<&str>, headers: &[(&str, &str)]) -> bool {
        let r = request(peer, headers);
        Trust::default().trusts(r.headers(), r.extensions())
    }

    #[test]
    fn private_networks_are_the_ones_the_internet_cannot_route() {
        for private in [
            "127.0.0.1",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.0.1",
            "::1",
            "fd00::1",
            "fc12::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_private(private.parse().unwrap()), "{private}");
        }
        for public in [
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "100.63.255.255",
            "192.0.2.1",
            "2001:db8::1",
            "fec0::1",
            "::ffff:8.8.8.8",
            "::",
            "0.0.0.0",
        ] {
            assert!(!is_private(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn the_default_trusts_private_peers_and_no_one_else() {
        assert!(default_trusts(Some("10.0.0.7:1"), &[]));
        assert!(default_trusts(Some("[::1]:1"), &[]));
        assert!(!default_trusts(Some("203.0.113.7:1"), &[]));
        assert!(!default_trusts(Some("[2001:db8::7]:1"), &[]));
        assert!(!default_trusts(None, &[]));
    }

    #[test]
    fn through_an_untrusted_proxy_every_forwarded_address_must_be_private() {
        let peer = Some("10.0.0.2:1");
        assert!(default_trusts(peer, &[("x-forwarded-for", "10.4.0.17")]));
        assert!(default_trusts(
            peer,
            &[("x-forwarded-for", "10.4.0.17, 192.168.0.3")]
        ));
        assert!(!default_trusts(
            peer,
            &[("x-forwarded-for", "198.51.100.7")]
        ));
        assert!(!default_trusts(
            peer,
            &[("x-forwarded-for", "10.0.0.1, 198.51.100.7")]
        ));
        // Two lines: the second one's client is public.
        assert!(!default_trusts(
            peer,
            &[
                ("x-forwarded-for", "10.0.0.1"),
                ("x-forwarded-for", "198.51.100.7")
            ]
        ));
        assert!(!default_trusts(peer, &[("x-forwarded-for", "unknown")]));
        assert!(!default_trusts(peer, &[("x-real-ip", "198.51.100.7")]));
        assert!(default_trusts(
            peer,
            &[("forwarded", "for=10.1.1.1;proto=http")]
        ));
        assert!(default_trusts(
            peer,
            &[("forwarded", "for=\"[fd00::1]:443\", for=10.1.1.1")]
        ));
        assert!(!default_trusts(
            peer,
            &[("forwarded", "for=10.1.1.1, for=198.51.100.7")]
        ));
        assert!(!default_trusts(peer, &[("forwarded", "for=_hidden")]));
        assert!(!default_trusts(peer, &[("forwarded", "proto=https")]));
    }

    #[test]
    fn a_resolved_client_address_decides_alone() {
        let mut r = request(Some("10.0.0.2:1"), &[("x-forwarded-for", "198.51.100.7")]);
        r.extensions_mut()
            .insert(ClientAddr::new("198.51.100.7".parse().unwrap()));
        assert!(!Trust::default().trusts(r.headers(), r.extensions()));
        let mut r = request(Some("10.0.0.2:1"), &[("x-forwarded-for", "10.9.9.9")]);
        r.extensions_mut()
            .insert(ClientAddr::new("10.9.9.9".parse().unwrap()));
        assert!(Trust::default().trusts(r.headers(), r.extensions()));
    }

    #[test]
    fn the_other_choices() {
        let public = request(Some("203.0.113.7:1"), &[]);
        let private = request(Some("10.20.3.4:1"), &[]);
        let judge =
            |trust: &Trust, r: &http::Request<()>| trust.trusts(r.headers(), r.extensions());
        assert!(judge(&Trust::everyone(), &public));
        assert!(!judge(&Trust::nobody(), &private));
        let fleet = Trust::networks([IpNet::new("10.20.0.0".parse().unwrap(), 16).unwrap()]);
        assert!(judge(&fleet, &private));
        assert!(!judge(&fleet, &public));
        assert!(!judge(&Trust::networks([]), &private));
        let header = Trust::when(|headers, _| headers.contains_key("x-internal"));
        assert!(!judge(&header, &private));
        assert!(judge(&header, &request(None, &[("x-internal", "1")])));
        assert_eq!(
            format!("{:?}", Trust::default()),
            "Trust::private_networks()"
        );
    }
}
