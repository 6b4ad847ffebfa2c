//! IP networks, for the proxies a server trusts ([`TrustedProxies`](super::TrustedProxies)):
//! [`IpNet`].

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use overload_core::ConfigError;

/// An IP network such as `10.0.0.0/8` or `2001:db8::/32`; a bare address is a network of
/// one. IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are matched as the IPv4 address.
///
/// ```
/// use overload_signal::signal::IpNet;
///
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse().unwrap()));
/// assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse().unwrap()));
/// assert_eq!(
///     "10.0.0.0/33".parse::<IpNet>().unwrap_err().to_string(),
///     "ip_net must be an IPv4 address with a prefix length of at most 32, got \"10.0.0.0/33\""
/// );
/// # Ok::<(), overload_signal::ConfigError>(())
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

    /// The network's address: its first address, host bits cleared.
    pub const fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The length of the network's prefix, in bits: 0 for a network that holds every
    /// address of its family, 32 (IPv4) or 128 (IPv6) for a single address.
    pub const fn prefix(&self) -> u8 {
        self.prefix
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
pub(crate) fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
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
}
