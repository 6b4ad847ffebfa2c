//! Which network a request's client is in, for the fair admission of new keys past the
//! cap: each network's new keys share an overflow limit of that network's own.
//!
//! The networks are the overload layer's caller networks
//! ([`PeerIp::network`](overload_signal::signal::PeerIp::network)): an IPv4 `/24`, the
//! smallest block routed between networks on the Internet, so the one a client holds most
//! cheaply; an IPv6 `/48`, what a site is assigned (a `/48` holds 65 536 `/64`s, which one
//! client can key requests by).

use std::net::IpAddr;

use overload_signal::signal::PeerIp;

/// The network of a client, as a number: 0 for a request without a client address (such
/// requests are one network), otherwise a tag (1 for IPv4, 2 for IPv6) above the network's
/// bits (an IPv4-mapped IPv6 address counts as IPv4).
pub(crate) fn network_of(client: Option<IpAddr>) -> u64 {
    const V4_SHIFT: u32 = 32 - PeerIp::IPV4_PREFIX as u32;
    const V6_SHIFT: u32 = 128 - PeerIp::IPV6_PREFIX as u32;
    match client.map(PeerIp::network) {
        None => 0,
        Some(IpAddr::V4(v4)) => (1 << 48) | u64::from(v4.to_bits() >> V4_SHIFT),
        Some(IpAddr::V6(v6)) => (2 << 48) | (v6.to_bits() >> V6_SHIFT) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(ip: &str) -> u64 {
        network_of(Some(ip.parse().unwrap()))
    }

    #[test]
    fn networks_are_ipv4_slash_24_and_ipv6_slash_48() {
        assert_eq!(net("192.0.2.1"), net("192.0.2.254"));
        assert_ne!(net("192.0.2.1"), net("192.0.3.1"));
        assert_eq!(net("2001:db8:bad:1::1"), net("2001:db8:bad:ffff::9"));
        assert_ne!(net("2001:db8:bad::1"), net("2001:db8:bae::1"));
        assert_eq!(
            net("::ffff:192.0.2.1"),
            net("192.0.2.9"),
            "IPv4-mapped is IPv4"
        );
        assert_ne!(net("0.0.0.0"), network_of(None));
        assert_ne!(net("0.0.0.0"), net("::"));
    }
}
