//! IP networks, for the proxies a [`ClientIp`](super::ClientIp) trusts: [`IpNet`].

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use overload_core::ConfigError;

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
pub(super) fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
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
