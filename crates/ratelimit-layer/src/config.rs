//! A plain configuration struct, for command-line flags and configuration files.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::algorithm::{FixedWindow, Limiter, SlidingWindow, TokenBucket};
use crate::key::ClientIp;
use crate::keyed::DEFAULT_MAX_KEYS;
use crate::layer::{DEFAULT_POLICY_NAME, InvalidConfig, RateLimitBuilder, RateLimitLayer};

/// Which algorithm a [`RateLimitConfig`] uses; parses from `token-bucket`, `fixed-window`
/// or `sliding-window`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// [`TokenBucket`]: `rate` per `period`, bursts of `burst`. The default.
    #[default]
    TokenBucket,
    /// [`FixedWindow`]: `rate` per window of `period`.
    FixedWindow,
    /// [`SlidingWindow`]: about `rate` per sliding window of `period`.
    SlidingWindow,
}

impl Algorithm {
    /// The name [`FromStr`] accepts.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TokenBucket => "token-bucket",
            Self::FixedWindow => "fixed-window",
            Self::SlidingWindow => "sliding-window",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not an [`Algorithm`] or a [`KeyBy`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownName {
    what: &'static str,
    expected: &'static str,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown rate limit {}: expected {}",
            self.what, self.expected
        )
    }
}

impl std::error::Error for UnknownName {}

impl FromStr for Algorithm {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "token-bucket" => Ok(Self::TokenBucket),
            "fixed-window" => Ok(Self::FixedWindow),
            "sliding-window" => Ok(Self::SlidingWindow),
            _ => Err(UnknownName {
                what: "algorithm",
                expected: "token-bucket, fixed-window or sliding-window",
            }),
        }
    }
}

/// What a [`RateLimitConfig`] limits separately; parses from `global` or `ip`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KeyBy {
    /// One limit for all requests. The default.
    #[default]
    Global,
    /// One limit per client IP address ([`RateLimitConfig::client_ip`]).
    Ip,
}

impl KeyBy {
    /// The name [`FromStr`] accepts.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Global => "global",
            Self::Ip => "ip",
        }
    }
}

impl fmt::Display for KeyBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KeyBy {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "global" => Ok(Self::Global),
            "ip" => Ok(Self::Ip),
            _ => Err(UnknownName {
                what: "key",
                expected: "global or ip",
            }),
        }
    }
}

/// The default rate of [`RateLimitConfig`]: 1000 requests per second, the limit of the
/// paper's retry-amplification example.
pub const DEFAULT_RATE: u32 = 1_000;

/// A rate limit as plain data, mapping one to one onto command-line flags such as
/// `--rate-limit <per second> --burst <n> --algorithm token-bucket|fixed-window|sliding-window
/// --key global|ip`.
///
/// ```
/// use ratelimit_layer::{Algorithm, KeyBy, RateLimitConfig};
///
/// let config = RateLimitConfig {
///     rate: 100,
///     burst: Some(20),
///     algorithm: "token-bucket".parse::<Algorithm>()?,
///     key: "ip".parse::<KeyBy>()?,
///     ..RateLimitConfig::default()
/// };
/// let layer = config.layer()?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitConfig {
    /// The algorithm. Default: [`Algorithm::TokenBucket`].
    pub algorithm: Algorithm,
    /// Requests (units of cost) per `period`: the token bucket's rate, or the windows'
    /// quota. Default: [`DEFAULT_RATE`] (1000).
    pub rate: u32,
    /// The period of `rate`: the token bucket's refill period, or the window length.
    /// Default: one second.
    pub period: Duration,
    /// The token bucket's burst; `None` means `rate` (one period's worth). Must be `None`
    /// for the window algorithms, whose burst is their quota. Default: `None`.
    pub burst: Option<u32>,
    /// What is limited separately. Default: [`KeyBy::Global`].
    pub key: KeyBy,
    /// Where [`KeyBy::Ip`] finds the client address. Default: [`ClientIp::socket_addr`]
    /// (a `SocketAddr` extension, no trusted proxies).
    pub client_ip: ClientIp,
    /// The cap on tracked keys with [`KeyBy::Ip`]. Default: [`DEFAULT_MAX_KEYS`] (100 000).
    pub max_keys: usize,
    /// The policy name in the `RateLimit` fields and the metrics. Default:
    /// [`DEFAULT_POLICY_NAME`] (`default`).
    pub policy_name: String,
    /// Whether admitted responses carry the `RateLimit` fields. Default: `false`.
    pub admitted_headers: bool,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::default(),
            rate: DEFAULT_RATE,
            period: Duration::from_secs(1),
            burst: None,
            key: KeyBy::default(),
            client_ip: ClientIp::default(),
            max_keys: DEFAULT_MAX_KEYS,
            policy_name: DEFAULT_POLICY_NAME.to_owned(),
            admitted_headers: false,
        }
    }
}

impl RateLimitConfig {
    /// Builds the layer.
    ///
    /// # Errors
    ///
    /// Any rule of the chosen algorithm ([`InvalidLimit`](crate::InvalidLimit)), a burst
    /// with a window algorithm, and the rules of [`RateLimitBuilder::build`]; see
    /// [`InvalidConfig`].
    pub fn layer(&self) -> Result<RateLimitLayer, InvalidConfig> {
        match self.algorithm {
            Algorithm::TokenBucket => {
                let burst = self.burst.unwrap_or(self.rate);
                self.finish(TokenBucket::new(self.rate, self.period, burst)?)
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow if self.burst.is_some() => {
                Err(InvalidConfig::BurstWithWindow)
            }
            Algorithm::FixedWindow => self.finish(FixedWindow::new(self.rate, self.period)?),
            Algorithm::SlidingWindow => self.finish(SlidingWindow::new(self.rate, self.period)?),
        }
    }

    fn finish<L: Limiter>(&self, limiter: L) -> Result<RateLimitLayer, InvalidConfig> {
        let builder: RateLimitBuilder<L> = RateLimitLayer::builder(limiter)
            .max_keys(self.max_keys)
            .policy_name(&self.policy_name)
            .admitted_headers(self.admitted_headers);
        match self.key {
            KeyBy::Global => builder.build(),
            KeyBy::Ip => builder.key_by_client_ip(self.client_ip.clone()).build(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InvalidLimit;

    #[test]
    fn names_round_trip() {
        for a in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ] {
            assert_eq!(a.to_string().parse::<Algorithm>(), Ok(a));
        }
        for k in [KeyBy::Global, KeyBy::Ip] {
            assert_eq!(k.to_string().parse::<KeyBy>(), Ok(k));
        }
        assert_eq!(
            "leaky".parse::<Algorithm>().unwrap_err().to_string(),
            "unknown rate limit algorithm: expected token-bucket, fixed-window or sliding-window"
        );
        assert!("IP".parse::<KeyBy>().is_err());
    }

    #[test]
    fn every_combination_builds() {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ] {
            for key in [KeyBy::Global, KeyBy::Ip] {
                let config = RateLimitConfig {
                    algorithm,
                    key,
                    ..RateLimitConfig::default()
                };
                assert!(config.layer().is_ok(), "{algorithm} {key}");
            }
        }
    }

    #[test]
    fn invalid_configs_are_refused() {
        let zero = RateLimitConfig {
            rate: 0,
            ..RateLimitConfig::default()
        };
        assert_eq!(
            zero.layer().unwrap_err(),
            InvalidConfig::Limit(InvalidLimit::ZeroRate)
        );
        let burst = RateLimitConfig {
            algorithm: Algorithm::SlidingWindow,
            burst: Some(5),
            ..RateLimitConfig::default()
        };
        assert_eq!(burst.layer().unwrap_err(), InvalidConfig::BurstWithWindow);
        let window = RateLimitConfig {
            algorithm: Algorithm::FixedWindow,
            period: Duration::ZERO,
            ..RateLimitConfig::default()
        };
        assert_eq!(
            window.layer().unwrap_err(),
            InvalidConfig::Limit(InvalidLimit::ZeroPeriod)
        );
        let keys = RateLimitConfig {
            key: KeyBy::Ip,
            max_keys: 0,
            ..RateLimitConfig::default()
        };
        assert_eq!(keys.layer().unwrap_err(), InvalidConfig::ZeroMaxKeys);
        let name = RateLimitConfig {
            policy_name: String::new(),
            ..RateLimitConfig::default()
        };
        assert!(matches!(
            name.layer().unwrap_err(),
            InvalidConfig::Policy(_)
        ));
        assert_eq!(
            name.layer().unwrap_err().to_string(),
            "name must be non-empty printable ASCII (0x20 to 0x7e), got \"\""
        );
    }
}
