//! IP networks, for the proxies a server trusts ([`TrustedProxies`](super::TrustedProxies)):
//! [`IpNet`].

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use overload_core::ConfigError;

/// An IP network such as `10.0.0.0/8` or `2001:db8::/32`; a bare address is a network of
/// one. IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are matched as the IPv4 address.
///
/// An IPv4-mapped IPv6 network is the IPv4 network it holds: `::ffff:10.0.0.0/104` (a
/// prefix written after an IPv6 address counts IPv6 bits) is `10.0.0.0/8`, and
/// `::ffff:0:0/96` is all of IPv4, `0.0.0.0/0`. An IPv6 network that holds every
/// IPv4-mapped address (`::/8`, `::/80`) holds every IPv4 address too.
///
/// ```
/// use overload_signal::signal::IpNet;
///
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse().unwrap()));
/// assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse().unwrap()));
/// assert_eq!("::ffff:10.0.0.0/104".parse::<IpNet>()?, net);
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
        if ip.is_ipv4() == self.addr.is_ipv4() {
            return mask(ip, self.prefix) == self.addr;
        }
        // NOTE: an IPv4 address is also its IPv4-mapped IPv6 form; an IPv6 network holds
        // it when it holds that form (`to_canonical` turned the form into the address).
        ip.is_ipv4() && self.holds_every_ipv4_mapped()
    }

    /// Whether this is an IPv6 network that holds every IPv4-mapped address
    /// (`::ffff:0:0/96`), so every IPv4 address.
    pub(crate) fn holds_every_ipv4_mapped(&self) -> bool {
        self.addr.is_ipv6()
            && self.prefix <= IPV4_MAPPED_PREFIX
            && mask(IpAddr::V6(IPV4_MAPPED), self.prefix) == self.addr
    }

    /// The first and the last address of the network, as numbers of its family (IPv4
    /// addresses within `0..=u32::MAX`).
    pub(crate) fn range(&self) -> (u128, u128) {
        match self.addr {
            IpAddr::V4(v4) => {
                let first = u32::from(v4);
                let last = first | u32::MAX.checked_shr(u32::from(self.prefix)).unwrap_or(0);
                (u128::from(first), u128::from(last))
            }
            IpAddr::V6(v6) => {
                let first = u128::from(v6);
                let last = first | u128::MAX.checked_shr(u32::from(self.prefix)).unwrap_or(0);
                (first, last)
            }
        }
    }
}

/// `::ffff:0:0`, the first IPv4-mapped IPv6 address, and the prefix of their network.
const IPV4_MAPPED: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0);
const IPV4_MAPPED_PREFIX: u8 = 96;

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
        if let (IpAddr::V6(v6), Some(p)) = (addr, prefix) {
            if v6.to_ipv4_mapped().is_some() {
                return Self::mapped(v6, p)
                    .ok_or_else(|| invalid("an IPv6 address with a prefix length of at most 128"));
            }
        }
        let addr = addr.to_canonical();
        let max = max_prefix(addr);
        let prefix = match prefix {
            None => max,
            Some(p) => parse_prefix(p).filter(|&n| n <= max).ok_or_else(|| {
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

impl IpNet {
    /// The network `v6/prefix` of an IPv4-mapped address, the prefix counting IPv6 bits:
    /// the IPv4 network it holds from `/96` on, an IPv6 network (which holds every
    /// IPv4-mapped address, and more) below. `None` for a prefix that is not a number
    /// within 0..=128.
    fn mapped(v6: Ipv6Addr, prefix: &str) -> Option<Self> {
        let prefix = parse_prefix(prefix).filter(|&p| p <= 128)?;
        Some(match prefix.checked_sub(IPV4_MAPPED_PREFIX) {
            Some(v4_prefix) => {
                let v4 = IpAddr::V4(v6.to_ipv4_mapped()?);
                Self {
                    addr: mask(v4, v4_prefix),
                    prefix: v4_prefix,
                }
            }
            None => Self {
                addr: mask(IpAddr::V6(v6), prefix),
                prefix,
            },
        })
    }
}

/// A prefix length as written: one to three decimal digits.
fn parse_prefix(p: &str) -> Option<u8> {
    if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok()
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
        // IPv4-mapped IPv6 networks are the IPv4 networks they hold (issue 31, finding 6),
        // their prefix counting IPv6 bits.
        let all_v4: IpNet = "::ffff:0:0/96".parse().unwrap();
        assert_eq!(all_v4.to_string(), "0.0.0.0/0");
        assert_eq!(
            "::ffff:192.168.0.0/112"
                .parse::<IpNet>()
                .unwrap()
                .to_string(),
            "192.168.0.0/16"
        );
        assert_eq!(
            "::ffff:10.0.0.1".parse::<IpNet>().unwrap().to_string(),
            "10.0.0.1/32"
        );
        let wide: IpNet = "::/80".parse().unwrap();
        assert!(wide.holds_every_ipv4_mapped());
        assert!(wide.contains(ip("203.0.113.1")));
        assert!(wide.contains(ip("::ffff:203.0.113.1")));
        assert!(
            !"2001:db8::/32"
                .parse::<IpNet>()
                .unwrap()
                .contains(ip("203.0.113.1"))
        );
        assert!(!"::/96".parse::<IpNet>().unwrap().holds_every_ipv4_mapped());
        assert!("::ffff:1.2.3.4/129".parse::<IpNet>().is_err());
        assert_eq!(
            "10.0.0.0/8".parse::<IpNet>().unwrap().range(),
            (0x0a00_0000, 0x0aff_ffff)
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
