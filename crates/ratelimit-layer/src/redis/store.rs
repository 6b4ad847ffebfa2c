//! The connection to the Redis that holds a fleet's limits: [`RedisStore`].

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use overload_core::ConfigError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisError};

/// The Redis that holds a fleet's limits, and one connection to it that reconnects by
/// itself.
///
/// Cheap to clone; clones share the connection. One store can serve several layers (their
/// keys are apart by layer name and algorithm). The connection is made in the background
/// on the first decision, not when the store is built, so a server starts while Redis is
/// down (its layers fall back to their local share until Redis answers).
///
/// The client is redis-rs's connection manager: concurrent commands are multiplexed and
/// pipelined on one connection, and a dropped connection is re-established in the
/// background with exponential backoff and jitter, from a few milliseconds up to
/// [`reconnect_max_delay`](RedisStoreBuilder::reconnect_max_delay) between attempts.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::redis::RedisStore;
///
/// // The defaults.
/// let store = RedisStore::new("redis://127.0.0.1:6379")?;
/// // Customised: database 2, a password, a slower reconnection.
/// let store = RedisStore::builder("redis://:secret@10.0.0.5:6379/2")
///     .reconnect_max_delay(Duration::from_secs(2))
///     .build()?;
/// // The URL is checked when the store is built, and never printed with its password.
/// let err = RedisStore::new("http://127.0.0.1:6379").unwrap_err();
/// assert_eq!(err.field(), "url");
/// # let _ = store;
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<RedisStoreInner>,
}

struct RedisStoreInner {
    client: Client,
    config: ConnectionManagerConfig,
    manager: OnceLock<ConnectionManager>,
}

impl RedisStore {
    /// The default longest wait between two reconnection attempts: 500 ms, so that a Redis
    /// that comes back is found again within about half a second (the issue asks for
    /// fleet-wide limiting to resume within 2 s).
    pub const DEFAULT_RECONNECT_MAX_DELAY: Duration = Duration::from_millis(500);

    /// The default time allowed to open a connection: one second, redis-rs's default.
    /// Decisions never wait for it: each has its own budget.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

    /// The Redis at `url` (`redis://[user:password@]host[:port][/database]`, port 6379 by
    /// default), with the defaults.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] of kind `Invalid` on `url` when it is not a `redis://` URL (or a
    /// `redis+unix://` path).
    pub fn new(url: &str) -> Result<Self, ConfigError> {
        Self::builder(url).build()
    }

    /// A builder for the Redis at `url`, starting from the defaults of [`new`](Self::new).
    pub fn builder(url: &str) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.to_owned(),
            reconnect_max_delay: Self::DEFAULT_RECONNECT_MAX_DELAY,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// The connection, made on first use. It must be inside a tokio runtime, where the
    /// connection's tasks run.
    pub(crate) fn connection(&self) -> Result<ConnectionManager, RedisError> {
        if let Some(manager) = self.inner.manager.get() {
            return Ok(manager.clone());
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "a Redis-backed rate limit must run inside a tokio runtime",
            )));
        }
        let manager = ConnectionManager::new_lazy_with_config(
            self.inner.client.clone(),
            self.inner.config.clone(),
        )?;
        // NOTE: two first requests may race to make it; one wins, the other's (not yet
        // connected) is dropped.
        Ok(self.inner.manager.get_or_init(|| manager).clone())
    }

    /// Connects now, if not yet connected, and waits for Redis to answer `PING`.
    ///
    /// Optional: the first decision connects anyway. A server calls it at startup so that
    /// its first requests do not spend their budget on the connection's handshake, and to
    /// say early whether Redis is there. Must run inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Unreachable`] when Redis cannot be reached or does not answer; the store keeps
    /// reconnecting in the background, and layers fall back meanwhile.
    pub async fn ping(&self) -> Result<(), Unreachable> {
        let mut connection = self.connection().map_err(Unreachable)?;
        connection
            .send_packed_command(&redis::cmd("PING"))
            .await
            .and_then(redis::Value::extract_error)
            .map(drop)
            .map_err(Unreachable)
    }

    /// `host:port` (or the socket path) of the server, without credentials.
    pub fn addr(&self) -> String {
        self.inner.client.get_connection_info().addr().to_string()
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("addr", &self.addr())
            .field("connected", &self.inner.manager.get().is_some())
            .finish_non_exhaustive()
    }
}

/// Redis could not be reached or did not answer; from [`RedisStore::ping`].
#[derive(Debug)]
pub struct Unreachable(RedisError);

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redis does not answer: {}", self.0)
    }
}

impl std::error::Error for Unreachable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Builds a [`RedisStore`]; from [`RedisStore::builder`].
#[derive(Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    url: String,
    reconnect_max_delay: Duration,
    connect_timeout: Duration,
}

impl RedisStoreBuilder {
    /// The longest wait between two attempts to reconnect. Default: 500 ms
    /// ([`RedisStore::DEFAULT_RECONNECT_MAX_DELAY`]).
    pub const fn reconnect_max_delay(mut self, delay: Duration) -> Self {
        self.reconnect_max_delay = delay;
        self
    }

    /// The time allowed to open a connection. Default: one second
    /// ([`RedisStore::DEFAULT_CONNECT_TIMEOUT`]).
    pub const fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Builds the store; nothing is connected yet.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting, when the URL is not a Redis URL (`url`, kind
    /// `Invalid`) or a delay is zero (kind `OutOfRange`).
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        for (field, value) in [
            ("reconnect_max_delay", self.reconnect_max_delay),
            ("connect_timeout", self.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::out_of_range(field, value, "greater than zero"));
            }
        }
        let client = Client::open(self.url.as_str()).map_err(|e| {
            // NOTE: the URL may hold a password: name the rule and the parser's reason, not
            // the text.
            ConfigError::new(
                "url",
                overload_core::ConfigErrorKind::Invalid,
                format_args!(
                    "url must be redis://[user:password@]host[:port][/database]: {}",
                    e.detail().unwrap_or("not a Redis URL")
                ),
            )
        })?;
        let config = ConnectionManagerConfig::new()
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(self.reconnect_max_delay)
            .set_connection_timeout(Some(self.connect_timeout));
        Ok(RedisStore {
            inner: Arc::new(RedisStoreInner {
                client,
                config,
                manager: OnceLock::new(),
            }),
        })
    }
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // NOTE: never the URL, which may hold a password.
        f.debug_struct("RedisStoreBuilder")
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overload_core::ConfigErrorKind;

    #[test]
    fn urls_are_checked_and_passwords_never_printed() {
        let store = RedisStore::new("redis://:hunter2@127.0.0.1:6390/1").unwrap();
        assert_eq!(store.addr(), "127.0.0.1:6390");
        let debug = format!("{store:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        let builder = RedisStore::builder("redis://:hunter2@127.0.0.1");
        assert!(!format!("{builder:?}").contains("hunter2"));

        for bad in [
            "http://127.0.0.1:6379",
            "127.0.0.1:6379",
            "",
            "redis://:hunter2@[::1",
        ] {
            let err = RedisStore::new(bad).unwrap_err();
            assert_eq!(
                (err.field(), err.kind()),
                ("url", ConfigErrorKind::Invalid),
                "{bad}"
            );
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        let err = RedisStore::builder("redis://127.0.0.1")
            .reconnect_max_delay(Duration::ZERO)
            .build()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "reconnect_max_delay must be greater than zero, got 0ns"
        );
    }

    #[test]
    fn outside_a_runtime_the_connection_is_an_error_not_a_panic() {
        let store = RedisStore::new("redis://127.0.0.1:6390").unwrap();
        assert!(store.connection().is_err());
    }
}
