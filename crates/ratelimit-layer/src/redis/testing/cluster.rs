//! A throwaway Redis Cluster for tests: [`RedisCluster`].

use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::process::pause;
use super::server::RedisServer;

/// How long the Cluster has to agree on its slots, at start and after a failover.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);

/// A Redis Cluster on 127.0.0.1: `masters` masters with `replicas` replicas each, every
/// node a [`RedisServer`] started with `--cluster-enabled yes`, joined by
/// `redis-cli --cluster create`. Every node is killed when it is dropped.
///
/// `redis-cli` comes from `PATH`, or from the environment variable `REDIS_CLI`.
///
/// ```no_run
/// use ratelimit_layer::redis::RedisStore;
/// use ratelimit_layer::redis::testing::RedisCluster;
///
/// let cluster = RedisCluster::start(3, 1);
/// let store = RedisStore::cluster(cluster.urls()).unwrap();
/// # let _ = store;
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// How long a node that stops answering has before the Cluster takes it for failed:
    /// 1 s (`cluster-node-timeout`; Redis's default is 15 s), so that a replica takes over
    /// a killed master within a few seconds.
    pub const NODE_TIMEOUT: Duration = Duration::from_secs(1);

    /// Starts the nodes, makes them a Cluster, and waits until every node agrees that all
    /// slots are served.
    ///
    /// # Panics
    ///
    /// When a node cannot start, `redis-cli` fails, or the Cluster does not settle within
    /// 30 s: a test that needs it fails loudly, never skips.
    pub fn start(masters: usize, replicas: usize) -> Self {
        assert!(masters >= 3, "a Redis Cluster needs at least three masters");
        let timeout = Self::NODE_TIMEOUT.as_millis().to_string();
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    &timeout,
                    // NOTE: a replica that lost its master long ago may still take over.
                    "--cluster-replica-validity-factor",
                    "0",
                ])
            })
            .collect();
        let cli = std::env::var_os("REDIS_CLI").unwrap_or_else(|| "redis-cli".into());
        let output = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {}: {e}; redis-cli comes with Redis (Debian and Ubuntu: \
                     `apt-get install redis-tools`), or point REDIS_CLI at it",
                    cli.to_string_lossy()
                )
            });
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = Self { nodes };
        cluster.wait_until_settled();
        cluster
    }

    /// `redis://127.0.0.1:PORT` of every node, masters and replicas, in start order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Every node, in start order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The index (in [`nodes`](Self::nodes)) of the running master that serves `slot`.
    ///
    /// # Panics
    ///
    /// When no running node says so.
    pub fn master_of(&self, slot: u16) -> usize {
        let ports: Vec<u16> = self.nodes.iter().map(RedisServer::port).collect();
        let port = Self::master_port(&ports, slot)
            .unwrap_or_else(|| panic!("no running master serves slot {slot}"));
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .expect("a node of this cluster")
    }

    /// The port of the master that serves `slot`, as the first node of `ports` that
    /// answers says (`CLUSTER NODES`), unless it is marked failed: for a test that watches
    /// a failover from another thread while the Cluster is killed from its own.
    pub fn master_port(ports: &[u16], slot: u16) -> Option<u16> {
        let nodes = ports
            .iter()
            .map(|port| cli(*port, "CLUSTER NODES"))
            .find(|answer| !answer.is_empty())?;
        // NOTE: one line per node: id, ip:port@bus-port, flags, master, ping, pong, epoch,
        // link state, then its slots (`0-5460`, `5461`).
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let mut bounds = range.splitn(2, '-').map(|b| b.parse::<u16>());
                match (bounds.next(), bounds.next()) {
                    (Some(Ok(start)), Some(Ok(end))) => (start..=end).contains(&slot),
                    (Some(Ok(one)), None) => one == slot,
                    _ => false,
                }
            });
            if serves {
                return fields[1]
                    .split(['@', ','])
                    .next()
                    .and_then(|addr| addr.rsplit(':').next())
                    .and_then(|port| port.parse().ok());
            }
        }
        None
    }

    /// Kills node `index` (SIGKILL), as a crash.
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].stop();
    }

    /// Waits until every running node says the Cluster is `ok` and serves all its slots
    /// (after [`kill`](Self::kill), once a replica has taken over).
    ///
    /// # Panics
    ///
    /// When that does not happen within 30 s.
    pub fn wait_until_settled(&self) {
        let started = Instant::now();
        loop {
            let settled = self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
                let info = cli(n.port(), "CLUSTER INFO");
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
            if settled {
                return;
            }
            assert!(
                started.elapsed() < SETTLE_WITHIN,
                "the Cluster did not settle within {SETTLE_WITHIN:?}"
            );
            pause(Duration::from_millis(50));
        }
    }
}

/// `redis-cli -p PORT COMMAND...`, its output; empty when it fails (a node starting).
fn cli(port: u16, command: &str) -> String {
    let cli = std::env::var_os("REDIS_CLI").unwrap_or_else(|| "redis-cli".into());
    Command::new(cli)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(command.split_whitespace())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}
