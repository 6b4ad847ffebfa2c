//! The Redis that holds a fleet's limits: [`RedisStore`], one node or a Cluster, over TCP
//! or TLS.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use overload_core::{ConfigError, ConfigErrorKind};
use redis::aio::ConnectionManagerConfig;
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::{
    Client, ClientTlsConfig, ConnectionAddr, IntoConnectionInfo, RedisError, TlsCertificates,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::connection::{
    ClusterClientMaker, RedisConnection, RedisConnections, RedisTopology, tcp_settings,
};

/// The Redis that holds a fleet's limits: one node or a Redis Cluster, over TCP or TLS,
/// and the connection to it, which reconnects by itself.
///
/// Cheap to clone; clones share the connection. One store can serve several layers (their
/// keys are apart by layer name and algorithm). The connection is made in the background
/// on the first decision, not when the store is built, so a server starts while Redis is
/// down (its layers fall back to their local share until Redis answers).
///
/// - **One node** ([`new`](Self::new), [`builder`](Self::builder)): redis-rs's connection
///   manager; concurrent commands are multiplexed and pipelined on one connection, and a
///   broken connection is re-established in the background with exponential backoff and
///   jitter, from 10 ms up to [`reconnect_max_delay`](RedisStoreBuilder::reconnect_max_delay)
///   between attempts.
/// - **A Cluster** ([`cluster`](Self::cluster), [`cluster_builder`](Self::cluster_builder)):
///   redis-rs's cluster client, given seed nodes; it reads the slot map from them, keeps a
///   multiplexed connection per node, sends each decision to the node that holds its key's
///   slot, follows `MOVED` and `ASK`, and reads the slot map again when it changes (a
///   master lost and its replica promoted). Each decision touches one key, so one slot.
/// - **TLS**: a `rediss://` URL, verified against the system's roots, or a CA of your own
///   ([`ca_certificate`](RedisStoreBuilder::ca_certificate)); with a client certificate
///   ([`client_certificate`](RedisStoreBuilder::client_certificate)) for services that ask
///   for one. Certificate checks cannot be turned off (`#insecure` is refused).
///
/// A connection that stops answering without breaking (a black hole: a failover that moved
/// the address, a firewall or a proxy that drops the flow silently), or a Cluster client
/// that stops answering (redis-rs's can, under a failover), is found by the layer's probe
/// and replaced within [`response_timeout`](RedisStoreBuilder::response_timeout); see the
/// [module docs](super) for the bounds. Every socket has TCP keepalive (10 s idle, then a
/// probe every 5 s, dropped after 3 unanswered) and, on Linux, `TCP_USER_TIMEOUT` of 10 s.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_layer::redis::RedisStore;
///
/// // The defaults, one node.
/// let store = RedisStore::new("redis://127.0.0.1:6379")?;
/// // A Cluster, from two of its nodes.
/// let cluster = RedisStore::cluster(["redis://10.0.0.5:6379", "redis://10.0.0.6:6379"])?;
/// // Customised: database 2, a password, a slower reconnection.
/// let custom = RedisStore::builder("redis://:secret@10.0.0.5:6379/2")
///     .reconnect_max_delay(Duration::from_secs(2))
///     .build()?;
/// // The URL is checked when the store is built, and never printed with its password.
/// let err = RedisStore::new("http://127.0.0.1:6379").unwrap_err();
/// assert_eq!(err.field(), "url");
/// # let _ = (store, cluster, custom);
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
///
/// A managed Redis over TLS, whose CA is the provider's own, asking for a client
/// certificate:
///
/// ```no_run
/// use ratelimit_layer::redis::RedisStore;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder("rediss://:secret@redis.example.com:6380")
///     .ca_certificate(std::fs::read("/etc/redis-tls/ca.pem")?)
///     .client_certificate(
///         std::fs::read("/etc/redis-tls/client.pem")?,
///         std::fs::read("/etc/redis-tls/client.key")?,
///     )
///     .build()?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<RedisStoreInner>,
}

struct RedisStoreInner {
    connections: RedisConnections,
    /// `host:port` of the node, or of the seeds; never credentials.
    addr: String,
    response_timeout: Duration,
}

impl RedisStore {
    /// The default longest wait between two reconnection attempts: 500 ms, so that a Redis
    /// that comes back is found again within about half a second (fleet-wide limiting is
    /// to resume within 2 s).
    pub const DEFAULT_RECONNECT_MAX_DELAY: Duration = Duration::from_millis(500);

    /// The default time allowed to open a connection (TCP, TLS and the handshake): one
    /// second, redis-rs's default. Decisions never wait for it: each has its own budget.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

    /// The default time after which a connection that leaves a command unanswered is taken
    /// for dead and replaced: one second. Redis answers in well under a millisecond; its
    /// slow log's default threshold is 10 ms (`slowlog-log-slower-than`), so a second is a
    /// hundred times what Redis itself calls slow.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

    /// The Redis at `url`, with the defaults: `redis://[user:password@]host[:port][/db]`
    /// (port 6379 by default), `rediss://` for TLS, or `redis+unix:///path`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] of kind `Invalid` on `url` when it is not such a URL.
    pub fn new(url: &str) -> Result<Self, ConfigError> {
        Self::builder(url).build()
    }

    /// A builder for the Redis at `url`, starting from the defaults of [`new`](Self::new).
    pub fn builder(url: &str) -> RedisStoreBuilder {
        RedisStoreBuilder::new(vec![url.to_owned()], false)
    }

    /// The Redis Cluster that `seeds` belong to, with the defaults. Any reachable seed is
    /// enough to find every node; give several, so that the store starts while one is down.
    /// Every seed is a `redis://` URL, or every one a `rediss://` URL (TLS), with the same
    /// credentials; a Cluster has no databases but 0.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `url` when a seed is not a TCP Redis URL, or on `seeds` when
    /// there is none or they disagree (TLS, credentials).
    pub fn cluster<I, S>(seeds: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::cluster_builder(seeds).build()
    }

    /// A builder for the Redis Cluster that `seeds` belong to, starting from the defaults
    /// of [`cluster`](Self::cluster).
    pub fn cluster_builder<I, S>(seeds: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        RedisStoreBuilder::new(
            seeds.into_iter().map(|s| s.as_ref().to_owned()).collect(),
            true,
        )
    }

    /// The connection and its generation, made on first use. It must be inside a tokio
    /// runtime, where the connection's tasks run.
    pub(crate) fn connection(&self) -> Result<(RedisConnection, u64), RedisError> {
        self.inner.connections.get()
    }

    /// Replaces connection `generation`, which stopped answering; see
    /// [`RedisConnections::replace`].
    pub(crate) fn replace(&self, generation: u64) -> Result<(RedisConnection, u64), RedisError> {
        self.inner.connections.replace(generation)
    }

    /// How long a command may go unanswered before its connection is replaced.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.inner.response_timeout
    }

    /// Keeps the nodes of a Cluster's `CLUSTER SLOTS` reply, for connections made anew.
    pub(crate) fn learn_nodes(&self, reply: &redis::Value) {
        self.inner.connections.target().learn_nodes(reply);
    }

    /// Connects now, if not yet connected, and waits for Redis to answer `PING` (every
    /// master, for a Cluster), within the [response
    /// timeout](RedisStoreBuilder::response_timeout).
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
        let (mut connection, _) = self.connection().map_err(Unreachable)?;
        let ping = redis::cmd("PING");
        match tokio::time::timeout(self.inner.response_timeout, connection.send(&ping)).await {
            Ok(reply) => reply
                .and_then(redis::Value::extract_error)
                .map(drop)
                .map_err(Unreachable),
            Err(_) => Err(Unreachable(RedisError::from((
                redis::ErrorKind::Io,
                "no answer to PING within the response timeout",
                format!("{:?}", self.inner.response_timeout),
            )))),
        }
    }

    /// `host:port` of the server (or its socket path), or, for a Cluster, of its seeds,
    /// comma-separated; without credentials.
    pub fn addr(&self) -> String {
        self.inner.addr.clone()
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(
            self.inner.connections.target(),
            RedisTopology::Cluster { .. }
        )
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("addr", &self.inner.addr)
            .field("cluster", &self.is_cluster())
            .field("connected", &self.inner.connections.is_connected())
            .finish_non_exhaustive()
    }
}

/// Redis could not be reached or did not answer; from [`RedisStore::ping`]. Why is its
/// [`source`](std::error::Error::source) (the client's error), which its own message does
/// not repeat: print the chain.
#[derive(Debug)]
pub struct Unreachable(RedisError);

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // NOTE: not the source's text: it is the `source()`, and a reporter that walks the
        // chain would print it twice.
        f.write_str("Redis does not answer")
    }
}

impl std::error::Error for Unreachable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Builds a [`RedisStore`]; from [`RedisStore::builder`] or [`RedisStore::cluster_builder`].
#[derive(Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    urls: Vec<String>,
    cluster: bool,
    reconnect_max_delay: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    ca_certificate: Option<Vec<u8>>,
    client_certificate: Option<(Vec<u8>, Vec<u8>)>,
}

impl RedisStoreBuilder {
    const fn new(urls: Vec<String>, cluster: bool) -> Self {
        Self {
            urls,
            cluster,
            reconnect_max_delay: RedisStore::DEFAULT_RECONNECT_MAX_DELAY,
            connect_timeout: RedisStore::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: RedisStore::DEFAULT_RESPONSE_TIMEOUT,
            ca_certificate: None,
            client_certificate: None,
        }
    }

    /// The longest wait between two attempts to reconnect to a node. Default: 500 ms
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

    /// How long a command may go unanswered before the connection is taken for dead and
    /// replaced by a new one (a black hole: the address moved, or the flow is dropped
    /// silently; a Cluster client that stopped answering). Default: one second
    /// ([`RedisStore::DEFAULT_RESPONSE_TIMEOUT`]). Decisions do not wait for it: each has its
    /// own budget; the layer's probe does. A Cluster client gives up on a command after it
    /// too.
    pub const fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The certificate authority (PEM, one or more certificates) that signed the server's
    /// certificate, instead of the system's roots: for a managed Redis whose CA is its
    /// provider's own. Needs `rediss://` URLs. Default: none, the system's roots.
    pub fn ca_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_certificate = Some(pem.into());
        self
    }

    /// A client certificate (PEM, the certificate and its chain) and its private key (PEM:
    /// PKCS#8, PKCS#1 or SEC1), for a Redis that authenticates clients by certificate
    /// (`tls-auth-clients yes`). Needs `rediss://` URLs. Default: none.
    pub fn client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_certificate = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// Builds the store; nothing is connected yet, and nothing of the process is changed.
    ///
    /// A TLS store uses rustls with the process's default crypto provider, which redis-rs
    /// (this crate's client) reads for every connection and cannot be given one of its
    /// own: install yours at start, before the first request
    /// (`rustls::crypto::CryptoProvider::install_default`). If the process has none when
    /// the store makes its first connection (its first [`ping`](RedisStore::ping), or the
    /// layer's first request), ring's is
    /// installed as the default then, as rustls itself would with this crate's features;
    /// an application that installs its own provider later than that gets an error from
    /// `install_default`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting:
    ///
    /// - `url`: not a Redis URL (kind `Invalid`); `#insecure`, which would turn certificate
    ///   checks off (`Invalid`); a Unix socket as a Cluster seed (`Invalid`);
    /// - `seeds`: no seed, or seeds that disagree on TLS or credentials (`Invalid`);
    /// - `reconnect_max_delay`, `connect_timeout`, `response_timeout`: zero (`OutOfRange`);
    /// - `ca_certificate`, `client_certificate`: not PEM, no certificate, no key (`Invalid`),
    ///   or given for a URL without TLS (`Conflict`).
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        for (field, value) in [
            ("reconnect_max_delay", self.reconnect_max_delay),
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::out_of_range(field, value, "greater than zero"));
            }
        }
        if self.urls.is_empty() {
            return Err(ConfigError::invalid(
                "seeds",
                "[]",
                "at least one redis:// or rediss:// URL",
            ));
        }
        let mut infos = Vec::with_capacity(self.urls.len());
        for url in &self.urls {
            infos.push(parse_url(url)?.set_tcp_settings(tcp_settings()));
        }
        let tls = infos
            .iter()
            .any(|info| matches!(info.addr(), ConnectionAddr::TcpTls { .. }));
        let certificates = self.certificates(tls)?;
        let addr = infos
            .iter()
            .map(|info| info.addr().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let target = if self.cluster {
            self.cluster_target(infos, certificates)?
        } else {
            let [info] = <[_; 1]>::try_from(infos)
                .map_err(|_| ConfigError::invalid("url", "several URLs", "one URL for one node"))?;
            let client = match certificates {
                Some(certificates) => Client::build_with_tls(info, certificates),
                None => Client::open(info),
            }
            .map_err(|e| url_error("url", &e))?;
            // NOTE: no response timeout of redis-rs's own: the layer's budget and probe
            // time every command, and a command redis-rs timed out would not make it
            // reconnect anyway.
            let config = ConnectionManagerConfig::new()
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(self.reconnect_max_delay)
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(None);
            RedisTopology::Node { client, config }
        };
        Ok(RedisStore {
            inner: Arc::new(RedisStoreInner {
                connections: RedisConnections::new(target),
                addr,
                response_timeout: self.response_timeout,
            }),
        })
    }

    fn cluster_target(
        &self,
        infos: Vec<redis::ConnectionInfo>,
        certificates: Option<TlsCertificates>,
    ) -> Result<RedisTopology, ConfigError> {
        if infos
            .iter()
            .any(|info| matches!(info.addr(), ConnectionAddr::Unix(_)))
        {
            return Err(ConfigError::invalid(
                "url",
                "redis+unix://",
                "a TCP address for a Cluster seed (Cluster nodes are reached over TCP)",
            ));
        }
        let first = &infos[0];
        let key = |info: &redis::ConnectionInfo| {
            let redis = info.redis_settings();
            (
                matches!(info.addr(), ConnectionAddr::TcpTls { .. }),
                redis.username().map(str::to_owned),
                redis.password().map(str::to_owned),
                redis.db(),
            )
        };
        if infos.iter().any(|info| key(info) != key(first)) {
            return Err(ConfigError::new(
                "seeds",
                ConfigErrorKind::Invalid,
                "seeds must agree: all redis:// or all rediss://, with the same credentials \
                 and database",
            ));
        }
        if first.redis_settings().db() != 0 {
            return Err(ConfigError::new(
                "url",
                ConfigErrorKind::Invalid,
                format_args!(
                    "url must name database 0 for a Cluster, which has no other, got {}",
                    first.redis_settings().db()
                ),
            ));
        }
        // NOTE: redis-rs retries a command inside the cluster client (a redirection, a
        // reconnection); a decision waits for none of it beyond its budget, so the waits
        // are kept short, and the slot map is read again at once after a failover.
        let (connect_timeout, response_timeout) = (self.connect_timeout, self.response_timeout);
        let max_wait = u64::try_from(self.reconnect_max_delay.as_millis()).unwrap_or(500);
        let make: ClusterClientMaker = Arc::new(move |nodes: Vec<redis::ConnectionInfo>| {
            let mut builder = ClusterClient::builder(nodes)
                .retries(4)
                .min_retry_wait(10)
                .max_retry_wait(max_wait)
                .connection_timeout(connect_timeout)
                .response_timeout(response_timeout)
                .tcp_settings(tcp_settings());
            if let Some(certificates) = &certificates {
                builder = builder.certs(certificates.clone());
            }
            builder.build()
        });
        // NOTE: built once here, so that a mistake is an error of the builder.
        make(infos.clone()).map_err(|e| url_error("seeds", &e))?;
        let config = ClusterConfig::new()
            .set_connection_timeout(self.connect_timeout)
            .set_response_timeout(self.response_timeout);
        Ok(RedisTopology::Cluster {
            seeds: infos,
            known: Arc::new(Mutex::new(Vec::new())),
            make,
            config,
        })
    }

    /// The CA and the client certificate, checked, for redis-rs.
    fn certificates(&self, tls: bool) -> Result<Option<TlsCertificates>, ConfigError> {
        if self.ca_certificate.is_none() && self.client_certificate.is_none() {
            return Ok(None);
        }
        if !tls {
            let field = if self.ca_certificate.is_some() {
                "ca_certificate"
            } else {
                "client_certificate"
            };
            return Err(ConfigError::conflict(
                field,
                format_args!("{field} needs TLS: a rediss:// URL"),
            ));
        }
        if let Some(pem) = &self.ca_certificate {
            check_certificates("ca_certificate", pem)?;
        }
        if let Some((certificate, key)) = &self.client_certificate {
            check_certificates("client_certificate", certificate)?;
            PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                ConfigError::new(
                    "client_certificate",
                    ConfigErrorKind::Invalid,
                    format_args!("client_certificate's key must be a PEM private key: {e}"),
                )
            })?;
        }
        Ok(Some(TlsCertificates {
            client_tls: self
                .client_certificate
                .clone()
                .map(|(client_cert, client_key)| ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: self.ca_certificate.clone(),
        }))
    }
}

/// A URL parsed by redis-rs, with `#insecure` refused.
fn parse_url(url: &str) -> Result<redis::ConnectionInfo, ConfigError> {
    let info = url
        .into_connection_info()
        .map_err(|e| url_error("url", &e))?;
    if let ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
        return Err(ConfigError::new(
            "url",
            ConfigErrorKind::Invalid,
            "url must not turn TLS certificate checks off (#insecure): give the server's CA \
             with ca_certificate instead",
        ));
    }
    Ok(info)
}

fn url_error(field: &'static str, e: &RedisError) -> ConfigError {
    // NOTE: the URL may hold a password: name the rule and the parser's reason, not the
    // text.
    ConfigError::new(
        field,
        ConfigErrorKind::Invalid,
        format_args!(
            "{field} must be redis://[user:password@]host[:port][/database] or rediss://... \
             for TLS: {}",
            e.detail().unwrap_or("not a Redis URL")
        ),
    )
}

fn check_certificates(field: &'static str, pem: &[u8]) -> Result<(), ConfigError> {
    let mut count = 0;
    for certificate in CertificateDer::pem_slice_iter(pem) {
        certificate.map_err(|e| {
            ConfigError::new(
                field,
                ConfigErrorKind::Invalid,
                format_args!("{field} must be PEM certificates: {e}"),
            )
        })?;
        count += 1;
    }
    if count == 0 {
        return Err(ConfigError::new(
            field,
            ConfigErrorKind::Invalid,
            format_args!("{field} must hold at least one PEM certificate, got none"),
        ));
    }
    Ok(())
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // NOTE: never the URLs, which may hold a password, nor a private key.
        f.debug_struct("RedisStoreBuilder")
            .field("cluster", &self.cluster)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("ca_certificate", &self.ca_certificate.is_some())
            .field("client_certificate", &self.client_certificate.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
