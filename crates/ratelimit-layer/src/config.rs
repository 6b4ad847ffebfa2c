//! A rate limit as plain data, for command-line flags and configuration files:
//! [`RateLimitConfig`], and the names its [`Algorithm`] and [`KeyBy`] parse from.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use overload_core::ConfigError;

use crate::algorithm::{FixedWindow, Limiter, SlidingWindow, TokenBucket};
use crate::key::ClientIp;
#[cfg(feature = "redis")]
use crate::rate_limit::Remote;
use crate::rate_limit::{RateLimitBuilder, RateLimitLayer};
#[cfg(feature = "redis")]
use crate::redis::{RedisAlgorithm, RedisLayerBuilder, RedisStore};

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
    /// Every algorithm, in the order of the names [`FromStr`] lists.
    pub const ALL: [Self; 3] = [Self::TokenBucket, Self::FixedWindow, Self::SlidingWindow];

    /// The name [`FromStr`] accepts.
    pub const fn as_str(self) -> &'static str {
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

impl FromStr for Algorithm {
    type Err = ConfigError;

    /// Parses `token-bucket`, `fixed-window` or `sliding-window`.
    ///
    /// # Errors
    ///
    /// Any other name: a [`ConfigError`] of kind `Invalid` on `algorithm`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "algorithm",
                    s,
                    "one of token-bucket, fixed-window, sliding-window",
                )
            })
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
    /// Every choice, in the order of the names [`FromStr`] lists.
    pub const ALL: [Self; 2] = [Self::Global, Self::Ip];

    /// The name [`FromStr`] accepts.
    pub const fn as_str(self) -> &'static str {
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
    type Err = ConfigError;

    /// Parses `global` or `ip`.
    ///
    /// # Errors
    ///
    /// Any other name: a [`ConfigError`] of kind `Invalid` on `key`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| ConfigError::invalid("key", s, "one of global, ip"))
    }
}

/// A rate limit as plain data, mapping one to one onto command-line flags such as
/// `--rate-limit <per second> --burst <n> --algorithm token-bucket|fixed-window|sliding-window
/// --key global|ip`.
///
/// ```
/// use ratelimit_layer::config::{Algorithm, KeyBy, RateLimitConfig};
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
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitConfig {
    /// The algorithm. Default: [`Algorithm::TokenBucket`].
    pub algorithm: Algorithm,
    /// Requests (units of cost) per `period`: the token bucket's rate, or the windows'
    /// quota. Default: 1000 ([`RateLimitConfig::DEFAULT_RATE`]).
    pub rate: u32,
    /// The period of `rate`: the token bucket's refill period, or the window length.
    /// Default: one second.
    pub period: Duration,
    /// The token bucket's burst; `None` means `rate` (one period's worth). Must be `None`
    /// for the window algorithms, whose burst is their quota. Default: `None`.
    pub burst: Option<u32>,
    /// What is limited separately. Default: [`KeyBy::Global`].
    pub key: KeyBy,
    /// Where [`KeyBy::Ip`] finds the client address. Default: [`ClientIp::new`] (a
    /// `SocketAddr` extension, no trusted proxies).
    pub client_ip: ClientIp,
    /// The cap on tracked keys with [`KeyBy::Ip`]. Default: 100 000
    /// ([`RateLimitLayer::DEFAULT_MAX_KEYS`]).
    pub max_keys: usize,
    /// The layer's name: the `name` label of its metrics, the `name` field of its logs, and
    /// the policy name of its `RateLimit` fields
    /// ([`RateLimitBuilder::name`](crate::RateLimitBuilder::name)). Default: `default`
    /// ([`RateLimitLayer::DEFAULT_NAME`]).
    pub name: String,
    /// Whether admitted responses carry the `RateLimit` fields. Default: `false`.
    pub admitted_headers: bool,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::default(),
            rate: Self::DEFAULT_RATE,
            period: Self::DEFAULT_PERIOD,
            burst: None,
            key: KeyBy::default(),
            client_ip: ClientIp::default(),
            max_keys: RateLimitLayer::DEFAULT_MAX_KEYS,
            name: RateLimitLayer::DEFAULT_NAME.to_owned(),
            admitted_headers: false,
        }
    }
}

impl RateLimitConfig {
    /// The default rate: 1000 requests per second, the limit of the paper's
    /// retry-amplification example.
    pub const DEFAULT_RATE: u32 = 1_000;

    /// The default period of the rate: one second.
    pub const DEFAULT_PERIOD: Duration = Duration::from_secs(1);

    /// Builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field, when `rate` is zero, `period` is zero, `burst`
    /// is zero or given with a window algorithm (whose burst is its quota), the token
    /// bucket's rate is above one per nanosecond of the period, or any rule of
    /// [`RateLimitBuilder::build`](crate::RateLimitBuilder::build) breaks.
    pub fn layer(&self) -> Result<RateLimitLayer, ConfigError> {
        // NOTE: the fields are checked here first, so that errors name this struct's fields
        // (`rate`, `period`), not the algorithms' settings they become (`quota`, `window`).
        if self.rate == 0 {
            return Err(ConfigError::out_of_range("rate", self.rate, "at least 1"));
        }
        if self.period.is_zero() || u64::try_from(self.period.as_nanos()).is_err() {
            return Err(ConfigError::out_of_range(
                "period",
                self.period,
                "greater than zero and at most 584 years",
            ));
        }
        match self.algorithm {
            Algorithm::TokenBucket => {
                let mut bucket = TokenBucket::builder(self.rate).period(self.period);
                if let Some(burst) = self.burst {
                    bucket = bucket.burst(burst);
                }
                self.finish(bucket.build()?)
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow if self.burst.is_some() => {
                Err(ConfigError::conflict(
                    "burst",
                    format_args!(
                        "burst ({}) applies to the token bucket only; {} admits the rate per period",
                        self.burst.unwrap_or_default(),
                        self.algorithm
                    ),
                ))
            }
            Algorithm::FixedWindow => self.finish(
                FixedWindow::builder(self.rate)
                    .window(self.period)
                    .build()?,
            ),
            Algorithm::SlidingWindow => self.finish(
                SlidingWindow::builder(self.rate)
                    .window(self.period)
                    .build()?,
            ),
        }
    }

    fn finish<L: Limiter>(&self, limiter: L) -> Result<RateLimitLayer, ConfigError> {
        let builder = RateLimitLayer::builder(limiter)
            .name(self.name.as_str())
            .admitted_headers(self.admitted_headers);
        match self.key {
            KeyBy::Global => self.global(builder)?.build(),
            KeyBy::Ip => builder
                .key_by_client_ip(self.client_ip.clone())
                .max_keys(self.max_keys)
                .build(),
        }
    }

    /// `builder` for a global limit: `max_keys` left at its default (it is a keyed limit's
    /// setting, which the builder refuses on a global one).
    fn global<L: Limiter>(
        &self,
        builder: RateLimitBuilder<L>,
    ) -> Result<RateLimitBuilder<L>, ConfigError> {
        if self.max_keys != RateLimitLayer::DEFAULT_MAX_KEYS {
            return Err(ConfigError::conflict(
                "max_keys",
                "max_keys applies to a limit keyed by client IP only; leave it at its default",
            ));
        }
        Ok(builder)
    }
}

/// Where a [`RateLimitConfig`] keeps its limit for a fleet, as plain data, mapping onto
/// flags such as `--redis-url redis://host:6379 --redis-local-share 0.33 --redis-budget 5ms
/// --redis-reservation 20`. Only with the feature `redis`; see [`crate::redis`].
///
/// ```
/// use ratelimit_layer::config::{RateLimitConfig, RedisConfig};
/// use ratelimit_layer::redis::RedisStore;
///
/// // The defaults.
/// let redis = RedisConfig::new(RedisStore::new("redis://127.0.0.1:6379")?);
/// // Customised: a Cluster, a third of the limit while it is away, a local reservation.
/// let redis = RedisConfig {
///     local_share: 1.0 / 3.0,
///     reservation: 20,
///     ..RedisConfig::new(RedisStore::cluster(["redis://10.0.0.5:6379"])?)
/// };
/// let layer = RateLimitConfig::default().redis_layer(&redis)?;
/// # let _ = layer;
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[cfg(feature = "redis")]
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// The Redis that holds the limit.
    pub store: RedisStore,
    /// The share of the limit a process applies while Redis is away. Default: 1
    /// ([`RedisLayerBuilder::DEFAULT_LOCAL_SHARE`]).
    pub local_share: f64,
    /// The time budget of a decision. Default: 5 ms
    /// ([`RedisLayerBuilder::DEFAULT_BUDGET`]).
    pub budget: Duration,
    /// The local reservation's largest batch, 0 for none. Default: 0
    /// ([`RedisLayerBuilder::reservation`]).
    pub reservation: u32,
    /// The cap on new keys made in Redis per second, per process. Default: 1 000
    /// ([`RedisLayerBuilder::DEFAULT_MAX_NEW_KEYS`]).
    pub max_new_keys: u32,
}

#[cfg(feature = "redis")]
impl RedisConfig {
    /// The limit kept in `store`, with the defaults.
    pub fn new(store: RedisStore) -> Self {
        Self {
            store,
            local_share: RedisLayerBuilder::DEFAULT_LOCAL_SHARE,
            budget: RedisLayerBuilder::DEFAULT_BUDGET,
            reservation: 0,
            max_new_keys: RedisLayerBuilder::DEFAULT_MAX_NEW_KEYS,
        }
    }
}

#[cfg(feature = "redis")]
impl RateLimitConfig {
    /// Builds the layer with its limit kept in Redis, shared by every process that uses the
    /// same Redis and name. It is a `RateLimitLayer<Remote>`; for a program that chooses at
    /// run time, [`layer`](Self::layer)'s converts into one (`.into()`).
    ///
    /// # Errors
    ///
    /// As [`layer`](Self::layer); and with [`Algorithm::FixedWindow`], which is not offered
    /// in Redis (kind `Invalid` on `algorithm`), or any rule of
    /// [`RedisLayerBuilder::build`].
    pub fn redis_layer(&self, redis: &RedisConfig) -> Result<RateLimitLayer<Remote>, ConfigError> {
        // NOTE: the local checks first, so that errors name this struct's fields.
        self.layer()?;
        match self.algorithm {
            Algorithm::TokenBucket => {
                let mut bucket = TokenBucket::builder(self.rate).period(self.period);
                if let Some(burst) = self.burst {
                    bucket = bucket.burst(burst);
                }
                self.finish_redis(bucket.build()?, redis)
            }
            Algorithm::SlidingWindow => self.finish_redis(
                SlidingWindow::builder(self.rate)
                    .window(self.period)
                    .build()?,
                redis,
            ),
            Algorithm::FixedWindow => Err(ConfigError::invalid(
                "algorithm",
                self.algorithm.as_str(),
                "token-bucket or sliding-window with Redis",
            )),
        }
    }

    fn finish_redis<L: RedisAlgorithm>(
        &self,
        limiter: L,
        redis: &RedisConfig,
    ) -> Result<RateLimitLayer<Remote>, ConfigError> {
        let builder = RateLimitLayer::builder(limiter)
            .name(self.name.as_str())
            .admitted_headers(self.admitted_headers);
        match self.key {
            KeyBy::Global => self
                .global(builder)?
                .redis(redis.store.clone())
                .local_share(redis.local_share)
                .budget(redis.budget)
                .reservation(redis.reservation)
                .max_new_keys(redis.max_new_keys)
                .build(),
            KeyBy::Ip => builder
                .key_by_client_ip(self.client_ip.clone())
                .max_keys(self.max_keys)
                .redis(redis.store.clone())
                .local_share(redis.local_share)
                .budget(redis.budget)
                .reservation(redis.reservation)
                .max_new_keys(redis.max_new_keys)
                .build(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.to_string().parse::<Algorithm>(), Ok(a));
        }
        for k in KeyBy::ALL {
            assert_eq!(k.to_string().parse::<KeyBy>(), Ok(k));
        }
        let err = "leaky".parse::<Algorithm>().unwrap_err();
        assert_eq!(err.field(), "algorithm");
        assert_eq!(
            err.to_string(),
            "algorithm must be one of token-bucket, fixed-window, sliding-window, got \"leaky\""
        );
        assert_eq!(
            "IP".parse::<KeyBy>().unwrap_err().to_string(),
            "key must be one of global, ip, got \"IP\""
        );
    }

    #[test]
    fn every_combination_builds() {
        for algorithm in Algorithm::ALL {
            for key in KeyBy::ALL {
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
    fn invalid_configs_name_the_field() {
        let message = |config: RateLimitConfig| config.layer().unwrap_err().to_string();
        for algorithm in Algorithm::ALL {
            assert_eq!(
                message(RateLimitConfig {
                    algorithm,
                    rate: 0,
                    ..RateLimitConfig::default()
                }),
                "rate must be at least 1, got 0",
                "{algorithm}"
            );
            assert_eq!(
                message(RateLimitConfig {
                    algorithm,
                    period: Duration::ZERO,
                    ..RateLimitConfig::default()
                }),
                "period must be greater than zero and at most 584 years, got 0ns",
                "{algorithm}"
            );
            let err = RateLimitConfig {
                algorithm,
                period: Duration::MAX,
                ..RateLimitConfig::default()
            }
            .layer()
            .unwrap_err();
            assert_eq!(err.field(), "period", "{algorithm}");
        }
        assert_eq!(
            message(RateLimitConfig {
                algorithm: Algorithm::SlidingWindow,
                burst: Some(5),
                ..RateLimitConfig::default()
            }),
            "burst (5) applies to the token bucket only; sliding-window admits the rate per period"
        );
        assert_eq!(
            message(RateLimitConfig {
                burst: Some(0),
                ..RateLimitConfig::default()
            }),
            "burst must be at least 1, got 0"
        );
        assert_eq!(
            message(RateLimitConfig {
                key: KeyBy::Ip,
                max_keys: 0,
                ..RateLimitConfig::default()
            }),
            "max_keys must be at least 1, got 0"
        );
        let err = RateLimitConfig {
            name: String::new(),
            ..RateLimitConfig::default()
        }
        .layer()
        .unwrap_err();
        assert_eq!(err.field(), "name");
        assert_eq!(err.kind(), overload_core::ConfigErrorKind::Invalid);
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_layers_build_for_the_algorithms_redis_offers() {
        let redis = RedisConfig::new(RedisStore::new("redis://127.0.0.1:6379").unwrap());
        assert_eq!(redis.budget, Duration::from_millis(5));
        for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingWindow] {
            for key in KeyBy::ALL {
                let config = RateLimitConfig {
                    algorithm,
                    key,
                    ..RateLimitConfig::default()
                };
                assert!(config.redis_layer(&redis).is_ok(), "{algorithm} {key}");
            }
        }
        let err = RateLimitConfig {
            algorithm: Algorithm::FixedWindow,
            ..RateLimitConfig::default()
        }
        .redis_layer(&redis)
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "algorithm must be token-bucket or sliding-window with Redis, got \"fixed-window\""
        );
        let err = RateLimitConfig::default()
            .redis_layer(&RedisConfig {
                local_share: 2.0,
                ..redis
            })
            .unwrap_err();
        assert_eq!(err.field(), "local_share");
    }
}
