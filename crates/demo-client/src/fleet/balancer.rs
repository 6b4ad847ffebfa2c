//! The fleet's balancer, HAProxy or Envoy ([`FleetBalancer`]), and what it saw of the run
//! ([`BalancerView`]).

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http::Uri;
use tower::BoxError;

use super::haproxy::{Balancer, BalancerSettings, ServerStats};
use crate::envoy::{EnvoyProxy, EnvoyStats, ProxySettings};
use crate::process::http_get_text;

/// The balancer in front of the fleet: which one, its executable and its settings.
///
/// # Example
///
/// ```
/// use demo_client::envoy::{ProxySettings, RetryPolicy};
/// use demo_client::fleet::{BalancerSettings, FleetBalancer};
///
/// // HAProxy as the fleet has always run it: a stopped server out within 5 s.
/// let haproxy = BalancerSettings::default();
/// let balancer = FleetBalancer::HaProxy {
///     program: "/usr/sbin/haproxy".as_ref(),
///     settings: &haproxy,
/// };
/// assert_eq!(balancer.detection_secs(), 5);
///
/// // Envoy with Istio's retries and the same health checks.
/// let envoy = ProxySettings {
///     retry: Some(RetryPolicy::istio_default()),
///     health_check: haproxy.check_interval,
///     ..ProxySettings::default()
/// };
/// let balancer = FleetBalancer::Envoy {
///     program: ".venv/bin/envoy".as_ref(),
///     settings: &envoy,
/// };
/// assert_eq!((balancer.name(), balancer.detection_secs()), ("Envoy", 5));
/// ```
#[derive(Debug, Clone, Copy)]
pub enum FleetBalancer<'a> {
    /// An HAProxy of our own ([`Balancer`]): round robin, `option forwardfor`.
    HaProxy {
        /// The `haproxy` executable ([`find_haproxy`](super::haproxy::find_haproxy)).
        program: &'a Path,
        /// Its settings.
        settings: &'a BalancerSettings,
    },
    /// An Envoy of our own ([`EnvoyProxy`]): round robin, the route's retry policy, the
    /// attempt count when the settings ask for it.
    Envoy {
        /// The `envoy` executable ([`find_envoy`](crate::envoy::find_envoy)).
        program: &'a Path,
        /// Its settings.
        settings: &'a ProxySettings,
    },
}

impl FleetBalancer<'_> {
    /// The balancer's name, as tables and messages print it: `HAProxy` or `Envoy`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::HaProxy { .. } => "HAProxy",
            Self::Envoy { .. } => "Envoy",
        }
    }

    /// Whole seconds the balancer takes at most to take a stopped server out; 0 without
    /// health checks. HAProxy: [`BalancerSettings::detection_secs`]. Envoy: the same rule,
    /// for the same reason: its health checks take a server out after three failures
    /// (`unhealthy_threshold: 3`), each at most the interval plus the check's 1 s timeout.
    pub fn detection_secs(&self) -> usize {
        match self {
            Self::HaProxy { settings, .. } => settings.detection_secs(),
            // NOTE: tied to `crate::envoy::config`: `unhealthy_threshold: 3`, `timeout: 1s`.
            Self::Envoy { settings, .. } => settings.health_check.map_or(0, |inter| {
                let ms = 3 * (inter.as_millis() + 1000);
                usize::try_from(ms.div_ceil(1000)).unwrap_or(usize::MAX)
            }),
        }
    }

    /// Starts the balancer in front of `servers`, its configuration and log in `dir`.
    pub(super) async fn start(
        &self,
        dir: &Path,
        servers: &[SocketAddr],
    ) -> Result<Running, BoxError> {
        Ok(match *self {
            Self::HaProxy { program, settings } => {
                Running::HaProxy(Balancer::start(program, dir, settings, servers).await?)
            }
            Self::Envoy { program, settings } => {
                Running::Envoy(EnvoyProxy::start(program, dir, settings, servers).await?)
            }
        })
    }
}

/// A running balancer of [`FleetBalancer::start`].
#[derive(Debug)]
pub(super) enum Running {
    HaProxy(Balancer),
    Envoy(EnvoyProxy),
}

impl Running {
    /// The address the clients send their requests to.
    pub(super) fn addr(&self) -> SocketAddr {
        match self {
            Self::HaProxy(b) => b.addr(),
            Self::Envoy(e) => e.addr(),
        }
    }

    /// What the balancer saw, `servers` named `s1`, `s2`, ... in their order.
    pub(super) async fn view(&self, servers: &[SocketAddr]) -> Result<BalancerView, BoxError> {
        match self {
            Self::HaProxy(b) => Ok(BalancerView::HaProxy(b.stats().await?)),
            Self::Envoy(e) => {
                let stats = e.stats().await?;
                let url: Uri = format!("http://{}/clusters", e.admin_addr()).parse()?;
                let clusters = http_get_text(url, Duration::from_secs(5)).await?;
                Ok(BalancerView::Envoy(EnvoyView::new(
                    &stats,
                    &EnvoyHost::parse(&clusters, servers),
                )))
            }
        }
    }

    /// Stops the balancer (SIGKILL to its process id) and waits for it to exit.
    pub(super) async fn shutdown(self) -> std::io::Result<()> {
        match self {
            Self::HaProxy(b) => b.shutdown().await,
            Self::Envoy(e) => e.shutdown().await,
        }
    }
}

/// What the balancer saw of a whole run.
#[derive(Debug, Clone, PartialEq)]
pub enum BalancerView {
    /// HAProxy's statistics, per server of the backend.
    HaProxy(Vec<ServerStats>),
    /// Envoy's counters for the cluster and its hosts.
    Envoy(EnvoyView),
}

impl BalancerView {
    /// Requests the balancer sent to the servers, its own retries included (HAProxy: the
    /// servers' sessions, `stot`; Envoy: `upstream_rq_total`).
    pub fn server_requests(&self) -> u64 {
        match self {
            Self::HaProxy(servers) => servers.iter().map(|s| s.sessions).sum(),
            Self::Envoy(view) => view.upstream_requests,
        }
    }

    /// Retries the balancer sent on its own (HAProxy: `wretr`; Envoy: `upstream_rq_retry`).
    pub fn retries(&self) -> u64 {
        match self {
            Self::HaProxy(servers) => servers.iter().map(|s| s.retries).sum(),
            Self::Envoy(view) => view.retries,
        }
    }

    /// Per server, its name (`s1`, ...) and the requests the balancer sent it.
    pub fn requests_per_server(&self) -> Vec<(String, u64)> {
        match self {
            Self::HaProxy(servers) => servers
                .iter()
                .map(|s| (s.name.clone(), s.sessions))
                .collect(),
            Self::Envoy(view) => view
                .hosts
                .iter()
                .map(|h| (h.name.clone(), h.requests))
                .collect(),
        }
    }

    /// The balancer's name: `HAProxy` or `Envoy`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::HaProxy(_) => "HAProxy",
            Self::Envoy(_) => "Envoy",
        }
    }
}

/// Envoy's view of the fleet's cluster over a whole run, from its admin interface
/// (`/stats` and `/clusters`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyView {
    /// Requests Envoy's clients sent it: `http.ingress.downstream_rq_total`.
    pub downstream_requests: u64,
    /// Requests Envoy sent to the servers, retries included: `upstream_rq_total`.
    pub upstream_requests: u64,
    /// Retries Envoy sent: `upstream_rq_retry`.
    pub retries: u64,
    /// Active health checks that failed, on every host: `health_check.failure` (Envoy
    /// counts no ejections; a stopped server fails one check a second or so until it is
    /// back).
    pub failed_checks: u64,
    /// Per host, in the fleet's order.
    pub hosts: Vec<EnvoyHost>,
}

impl EnvoyView {
    /// The view from Envoy's statistics and its hosts.
    pub fn new(stats: &EnvoyStats, hosts: &[EnvoyHost]) -> Self {
        Self {
            downstream_requests: stats.downstream_requests(),
            upstream_requests: stats.upstream_requests(),
            retries: stats.retries(),
            failed_checks: stats.cluster("health_check.failure"),
            hosts: hosts.to_vec(),
        }
    }
}

/// One host of the cluster, as Envoy's `/clusters` lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyHost {
    /// Its name in the fleet (`s1`, `s2`, `s3`).
    pub name: String,
    /// Requests Envoy sent it: `rq_total`.
    pub requests: u64,
    /// Requests it answered without a 5xx (`rq_success`: Envoy counts a `429` here).
    pub successes: u64,
    /// Requests answered with a 5xx (a stop signal among them) or reset: `rq_error`.
    pub errors: u64,
    /// Requests that timed out in Envoy: `rq_timeout`.
    pub timeouts: u64,
    /// Connections to it that failed: `cx_connect_fail`.
    pub connect_failures: u64,
    /// Its health flags when read (`healthy`, or Envoy's flags such as
    /// `/failed_active_hc`).
    pub health: String,
}

impl EnvoyHost {
    /// The hosts of the fleet's cluster in Envoy's plain-text `/clusters`
    /// (`upstream::127.0.0.1:7001::rq_total::12` lines), `servers` named `s1`, `s2`, ...
    /// in their order; a server Envoy does not list is all zeros, its health empty.
    pub fn parse(text: &str, servers: &[SocketAddr]) -> Vec<Self> {
        let mut hosts: Vec<Self> = (1..=servers.len())
            .map(|i| Self {
                name: format!("s{i}"),
                ..Self::default()
            })
            .collect();
        let prefix = format!("{}::", crate::envoy::CLUSTER);
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else {
                continue;
            };
            let mut parts = rest.splitn(3, "::");
            let (Some(addr), Some(stat), Some(value)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Some(i) = addr
                .parse::<SocketAddr>()
                .ok()
                .and_then(|a| servers.iter().position(|s| *s == a))
            else {
                continue;
            };
            let host = &mut hosts[i];
            let number = || value.trim().parse().unwrap_or_default();
            match stat {
                "rq_total" => host.requests = number(),
                "rq_success" => host.successes = number(),
                "rq_error" => host.errors = number(),
                "rq_timeout" => host.timeouts = number(),
                "cx_connect_fail" => host.connect_failures = number(),
                "health_flags" => value.trim().clone_into(&mut host.health),
                _ => {}
            }
        }
        hosts
    }
}

impl fmt::Display for BalancerView {
    /// One line per server (HAProxy), or one for the cluster and one per host (Envoy).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = if f.alternate() { "\n" } else { "; " };
        match self {
            Self::HaProxy(servers) => {
                for (i, s) in servers.iter().enumerate() {
                    if i > 0 {
                        f.write_str(sep)?;
                    }
                    write!(f, "{s}")?;
                }
                Ok(())
            }
            Self::Envoy(view) => {
                write!(
                    f,
                    "cluster: {} requests in, {} sent to the servers, {} retries, {} failed health checks",
                    view.downstream_requests,
                    view.upstream_requests,
                    view.retries,
                    view.failed_checks
                )?;
                for h in &view.hosts {
                    write!(
                        f,
                        "{sep}{}: {} requests, {} successes, {} errors, {} timeouts, {} connection failures, {}",
                        h.name,
                        h.requests,
                        h.successes,
                        h.errors,
                        h.timeouts,
                        h.connect_failures,
                        if h.health.is_empty() {
                            "health unknown"
                        } else {
                            &h.health
                        }
                    )?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_hosts_are_read_by_address() {
        let servers: Vec<SocketAddr> = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
            .map(|a| a.parse().unwrap())
            .to_vec();
        let text = "upstream::observability_name::upstream\n\
            upstream::default_priority::max_connections::4294967295\n\
            upstream::127.0.0.1:7002::cx_connect_fail::1\n\
            upstream::127.0.0.1:7002::rq_total::120\n\
            upstream::127.0.0.1:7002::rq_success::100\n\
            upstream::127.0.0.1:7002::rq_error::15\n\
            upstream::127.0.0.1:7002::rq_timeout::5\n\
            upstream::127.0.0.1:7002::health_flags::/failed_active_hc\n\
            upstream::127.0.0.1:7001::rq_total::90\n\
            upstream::127.0.0.1:7001::health_flags::healthy\n\
            upstream::127.0.0.1:9999::rq_total::7\n\
            other::127.0.0.1:7003::rq_total::8\n\
            upstream::127.0.0.1:7003::rq_total::not-a-number\n";
        let hosts = EnvoyHost::parse(text, &servers);
        assert_eq!(hosts.len(), 3);
        assert_eq!(
            hosts[1],
            EnvoyHost {
                name: "s2".into(),
                requests: 120,
                successes: 100,
                errors: 15,
                timeouts: 5,
                connect_failures: 1,
                health: "/failed_active_hc".into(),
            }
        );
        assert_eq!(
            (hosts[0].requests, hosts[0].health.as_str()),
            (90, "healthy")
        );
        assert_eq!((hosts[2].name.as_str(), hosts[2].requests), ("s3", 0));

        let stats = EnvoyStats::parse(
            "cluster.upstream.upstream_rq_total: 210\n\
             cluster.upstream.upstream_rq_retry: 10\n\
             cluster.upstream.health_check.failure: 13\n\
             http.ingress.downstream_rq_total: 200\n",
        );
        let view = BalancerView::Envoy(EnvoyView::new(&stats, &hosts));
        assert_eq!((view.server_requests(), view.retries()), (210, 10));
        assert_eq!(
            view.requests_per_server(),
            vec![("s1".into(), 90), ("s2".into(), 120), ("s3".into(), 0)]
        );
        let text = format!("{view:#}");
        assert!(
            text.contains(
                "200 requests in, 210 sent to the servers, 10 retries, 13 failed health checks"
            ),
            "{text}"
        );
        assert!(text.contains("\ns3: 0 requests"), "{text}");
        assert!(text.contains("health unknown"), "{text}");
    }

    #[test]
    fn haproxy_figures_are_the_servers_sums() {
        let view = BalancerView::HaProxy(vec![
            ServerStats {
                name: "s1".into(),
                sessions: 300,
                retries: 2,
                ..ServerStats::default()
            },
            ServerStats {
                name: "s2".into(),
                sessions: 600,
                retries: 1,
                ..ServerStats::default()
            },
        ]);
        assert_eq!((view.server_requests(), view.retries()), (900, 3));
        assert_eq!(view.name(), "HAProxy");
        assert_eq!(format!("{view:#}").lines().count(), 2);
    }

    #[test]
    fn envoy_takes_a_stopped_server_out_as_haproxy_does() {
        let program = Path::new("envoy");
        for (check, secs) in [
            (Some(Duration::from_millis(500)), 5),
            (Some(Duration::from_secs(2)), 9),
            (None, 0),
        ] {
            let settings = ProxySettings {
                health_check: check,
                ..ProxySettings::default()
            };
            let envoy = FleetBalancer::Envoy {
                program,
                settings: &settings,
            };
            let haproxy_settings = BalancerSettings {
                check_interval: check,
                ..BalancerSettings::default()
            };
            let haproxy = FleetBalancer::HaProxy {
                program,
                settings: &haproxy_settings,
            };
            assert_eq!(envoy.detection_secs(), secs, "{check:?}");
            assert_eq!(haproxy.detection_secs(), secs, "{check:?}");
        }
    }
}
