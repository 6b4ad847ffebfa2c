//! The connection under a [`RedisStore`](super::RedisStore): one node through redis-rs's
//! connection manager, or a Cluster through its cluster client ([`RedisConnection`]); made on
//! first use, and replaced whole when it stops answering ([`RedisConnections`]).

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::{TcpSettings, socket2::TcpKeepalive};
use redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult, Value,
};

/// How long an idle connection waits before the kernel sends a keepalive probe: 10 s.
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);

/// The interval between two keepalive probes: 5 s.
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// Unanswered keepalive probes before the kernel drops the connection: 3, so that a peer
/// gone without a word is found within 25 s of silence.
pub(crate) const KEEPALIVE_PROBES: u32 = 3;

/// How long written data may stay unacknowledged before the kernel drops the connection
/// (`TCP_USER_TIMEOUT`, Linux): 10 s.
pub(crate) const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);

/// The socket options of every connection: no Nagle delay (a decision is one small command
/// waiting for its reply), and the kernel's own watch over a dead peer (keepalive, and on
/// Linux a cap on unacknowledged data), a second line behind the layer's probe: they catch
/// a peer whose packets are dropped (a firewall forgetting the flow, a host gone), which
/// redis-rs then sees as a broken connection and replaces by itself.
pub(crate) fn tcp_settings() -> TcpSettings {
    let keepalive = TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    #[cfg(any(
        target_os = "linux",
        target_os = "android",
        target_os = "macos",
        target_os = "ios",
        target_os = "freebsd",
        target_os = "netbsd",
        target_os = "fuchsia",
        target_os = "illumos",
    ))]
    let keepalive = keepalive
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let settings = TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive);
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let settings = settings.set_user_timeout(TCP_USER_TIMEOUT);
    settings
}

/// Makes a Cluster client from seed nodes, with the store's settings.
pub(crate) type ClusterClientMaker =
    Arc<dyn Fn(Vec<ConnectionInfo>) -> RedisResult<ClusterClient> + Send + Sync>;

/// How to connect: to one node, or to a Cluster through its seeds.
// NOTE: one per store, made once: the size of its larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum RedisTopology {
    Node {
        client: Client,
        config: ConnectionManagerConfig,
    },
    Cluster {
        /// The seeds given.
        seeds: Vec<ConnectionInfo>,
        /// The nodes the Cluster said it has, last time it was asked (`CLUSTER SLOTS`):
        /// seeds too for a connection made anew, so that a replacement does not depend on
        /// the given seeds alone (one of which may be the node that was lost). Asked by
        /// every connection made, and by the probe when Redis answers it again.
        known: Arc<Mutex<Vec<(String, u16)>>>,
        make: ClusterClientMaker,
        config: ClusterConfig,
    },
}

impl RedisTopology {
    /// A new connection, not connected yet: it connects in the background (tokio tasks), so
    /// this must run inside a runtime.
    fn connect_lazily(&self) -> Result<RedisConnection, RedisError> {
        if self.is_tls() && rustls::crypto::CryptoProvider::get_default().is_none() {
            // NOTE: redis-rs 1.x builds its rustls configuration from the process's default
            // provider at every connection and takes no configuration of ours. With none
            // installed, rustls would install the one its features name, or panic when both
            // of its providers are compiled in (another crate may enable aws-lc-rs): ring's
            // is installed here instead, at the first connection and not when the store is
            // built, so that an application that installs its own at start keeps it. An
            // error means another thread installed one meanwhile.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        match self {
            Self::Node { client, config } => {
                ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                    .map(RedisConnection::Node)
            }
            Self::Cluster {
                seeds,
                known,
                make,
                config,
            } => {
                let mut nodes = seeds.clone();
                let first = &seeds[0];
                for (host, port) in known.lock().unwrap_or_else(PoisonError::into_inner).iter() {
                    let addr = match first.addr().clone() {
                        ConnectionAddr::TcpTls {
                            insecure,
                            tls_params,
                            ..
                        } => ConnectionAddr::TcpTls {
                            host: host.clone(),
                            port: *port,
                            insecure,
                            tls_params,
                        },
                        _ => ConnectionAddr::Tcp(host.clone(), *port),
                    };
                    if !nodes.iter().any(|n| *n.addr() == addr) {
                        nodes.push(first.clone().set_addr(addr));
                    }
                }
                let client = make(nodes)?;
                Ok(RedisConnection::Cluster(
                    client.get_pending_async_connection_with_config(config.clone()),
                ))
            }
        }
    }

    /// Whether connections are made over TLS (a Cluster's seeds all agree).
    fn is_tls(&self) -> bool {
        let info = match self {
            Self::Node { client, .. } => client.get_connection_info(),
            Self::Cluster { seeds, .. } => &seeds[0],
        };
        matches!(info.addr(), ConnectionAddr::TcpTls { .. })
    }

    /// Keeps the nodes a Cluster's `CLUSTER SLOTS` reply names, for the connections made
    /// anew; nothing for one node, or a reply of another shape.
    pub(crate) fn learn_nodes(&self, reply: &Value) {
        if let Self::Cluster { known, .. } = self {
            learn_nodes(known, reply);
        }
    }

    /// For a Cluster connection just made: asks it for the Cluster's nodes, in a task of
    /// its own, so that the connection that may replace it later reaches the nodes the
    /// Cluster has, and not only the seeds given; the first request under load never
    /// leaves time for a probe to ask. Nothing for one node. Within the client's own
    /// response timeout (a Cluster client gives up on a command after it).
    fn ask_nodes(&self, connection: &RedisConnection) {
        let (Self::Cluster { known, .. }, RedisConnection::Cluster(cluster)) = (self, connection)
        else {
            return;
        };
        let known = Arc::clone(known);
        let mut cluster = cluster.clone();
        tokio::spawn(async move {
            let slots = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
            if let Ok(reply) = cluster.req_packed_command(&slots).await {
                learn_nodes(&known, &reply);
            }
        });
    }
}

/// Keeps the nodes a `CLUSTER SLOTS` reply names in `known`; nothing for a reply of another
/// shape, or one that names none.
fn learn_nodes(known: &Mutex<Vec<(String, u16)>>, reply: &Value) {
    let Value::Array(ranges) = reply else {
        return;
    };
    let mut nodes = Vec::new();
    for range in ranges {
        let Value::Array(range) = range else { continue };
        for node in range.iter().skip(2) {
            let Value::Array(node) = node else { continue };
            if let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
                (node.first(), node.get(1))
            {
                let (Ok(host), Ok(port)) = (std::str::from_utf8(host), u16::try_from(*port)) else {
                    continue;
                };
                if !host.is_empty() && !nodes.iter().any(|(h, p)| h == host && *p == port) {
                    nodes.push((host.to_owned(), port));
                }
            }
        }
    }
    if !nodes.is_empty() {
        *known.lock().unwrap_or_else(PoisonError::into_inner) = nodes;
    }
}

/// A connection to a node or a Cluster; cheap to clone (clones share it).
#[derive(Clone)]
pub(crate) enum RedisConnection {
    /// One node, through redis-rs's connection manager: concurrent commands multiplexed
    /// and pipelined on one connection, re-established in the background when it breaks.
    Node(ConnectionManager),
    /// A Cluster, through redis-rs's cluster client: a multiplexed connection per node,
    /// each command sent to the node that holds its key's slot, `MOVED` and `ASK` followed,
    /// the slot map read again when it changes (a replica promoted after its master failed).
    Cluster(ClusterConnection),
}

impl RedisConnection {
    /// Sends `cmd` and reads its reply; a server's error reply is a value here
    /// (`Value::ServerError`), not an error.
    pub(crate) async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Node(manager) => manager.send_packed_command(cmd).await,
            Self::Cluster(cluster) => cluster.req_packed_command(cmd).await,
        }
    }
}

/// The store's connection, made on first use, and replaced when the layer finds that it
/// no longer answers.
pub(crate) struct RedisConnections {
    target: RedisTopology,
    current: RwLock<Option<Current>>,
}

struct Current {
    connection: RedisConnection,
    /// Which connection this is: 0 for the first, then one more per replacement, so that
    /// two probes that both found the same connection silent replace it once.
    generation: u64,
}

impl RedisConnections {
    pub(crate) const fn new(target: RedisTopology) -> Self {
        Self {
            target,
            current: RwLock::new(None),
        }
    }

    pub(crate) const fn target(&self) -> &RedisTopology {
        &self.target
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// The connection and its generation, made on first use. It must be inside a tokio
    /// runtime, where the connection's tasks run.
    pub(crate) fn get(&self) -> Result<(RedisConnection, u64), RedisError> {
        if let Some(current) = &*self.current.read().unwrap_or_else(PoisonError::into_inner) {
            return Ok((current.connection.clone(), current.generation));
        }
        in_runtime()?;
        let mut slot = self.current.write().unwrap_or_else(PoisonError::into_inner);
        // NOTE: another request may have made it while this one waited for the lock.
        if let Some(current) = &*slot {
            return Ok((current.connection.clone(), current.generation));
        }
        let connection = self.target.connect_lazily()?;
        self.target.ask_nodes(&connection);
        *slot = Some(Current {
            connection: connection.clone(),
            generation: 0,
        });
        Ok((connection, 0))
    }

    /// Drops connection `generation` (its tasks end with its last clone) and puts a new
    /// one in its place, unless it was replaced already. Returns the connection now in
    /// place and its generation.
    pub(crate) fn replace(&self, generation: u64) -> Result<(RedisConnection, u64), RedisError> {
        in_runtime()?;
        let mut slot = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(current) = &*slot {
            if current.generation != generation {
                return Ok((current.connection.clone(), current.generation));
            }
        }
        let connection = self.target.connect_lazily()?;
        self.target.ask_nodes(&connection);
        let next = generation.wrapping_add(1);
        *slot = Some(Current {
            connection: connection.clone(),
            generation: next,
        });
        Ok((connection, next))
    }
}

fn in_runtime() -> Result<(), RedisError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(RedisError::from((
            ErrorKind::Client,
            "a Redis-backed rate limit must run inside a tokio runtime",
        )));
    }
    Ok(())
}
