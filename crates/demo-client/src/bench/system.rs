//! The systems and models of the benchmark, and starting one system fresh for a point.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use http::Uri;
use tower::BoxError;

use crate::envoy::{EnvoyProxy, ProxySettings};
use crate::process::ServerProcess;

/// A system under test: a `demo-server --stack`, or Envoy's adaptive concurrency filter in
/// front of the bare server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum System {
    /// `--stack none`: the model alone.
    Bare,
    /// `--stack full`: the overload signal, the deadline layer and the rate limiter at the
    /// model's default rate.
    Full,
    /// `--stack adaptive`: the overload signal, the deadline layer and the adaptive limit.
    Adaptive,
    /// Envoy (its default worker count, one per core; no retries) with its adaptive
    /// concurrency filter, in front of `--stack none`.
    Envoy,
    /// `--stack tower-shed`: tower's `ConcurrencyLimit` + `LoadShed`.
    TowerShed,
    /// `--stack tower-resilience`: tower-resilience's Vegas limiter.
    TowerResilience,
    /// `--stack little`: little-loadshedder.
    Little,
}

impl System {
    /// Every system, in the order of the table.
    pub const ALL: [System; 7] = [
        System::Bare,
        System::Full,
        System::Adaptive,
        System::Envoy,
        System::TowerShed,
        System::TowerResilience,
        System::Little,
    ];

    /// The name on the command line and in the table.
    pub const fn name(self) -> &'static str {
        match self {
            System::Bare => "bare",
            System::Full => "full",
            System::Adaptive => "adaptive",
            System::Envoy => "envoy",
            System::TowerShed => "tower-shed",
            System::TowerResilience => "tower-resilience",
            System::Little => "little",
        }
    }

    /// The `demo-server --stack` it runs (`none` behind Envoy).
    pub const fn stack(self) -> &'static str {
        match self {
            System::Bare | System::Envoy => "none",
            other => other.name(),
        }
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for System {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        System::ALL
            .into_iter()
            .find(|system| system.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = System::ALL.iter().map(|s| s.name()).collect();
                format!("unknown system `{s}`; one of {}", names.join(", "))
            })
    }
}

/// A latency model of the demo server, with the capacity its loads are multiples of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Model {
    /// `--model mmc`: the paper's M/M/10, 50 ms mean service: 200 requests a second.
    Mmc,
    /// `--model article`: flat 100 ms up to its knee of 30 requests inside: 300 requests a
    /// second nominal. It has no hard capacity (past the knee it serves more, slower), so a
    /// goodput above 100 % is possible there.
    Article,
}

impl Model {
    /// Both models, in the order of the table.
    pub const ALL: [Model; 2] = [Model::Mmc, Model::Article];

    /// The name `demo-server --model` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Model::Mmc => "mmc",
            Model::Article => "article",
        }
    }

    /// Requests per second at the model's default settings: 200 for mmc, 300 for article.
    pub const fn capacity(self) -> f64 {
        match self {
            Model::Mmc => 200.0,
            Model::Article => 300.0,
        }
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Model {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Model::ALL
            .into_iter()
            .find(|model| model.name() == s)
            .ok_or_else(|| format!("unknown model `{s}`; one of mmc, article"))
    }
}

/// The executables the benchmark starts.
#[derive(Clone, Debug)]
pub struct Programs {
    /// `demo-server`.
    pub server: PathBuf,
    /// `envoy`; needed only for [`System::Envoy`].
    pub envoy: Option<PathBuf>,
}

/// The arguments of `demo-server` (after `--listen`) for `system` on `model`: the stack,
/// the model, `--abandoned serve` (work is served to the end, as the article's server
/// does).
pub fn server_args(system: System, model: Model) -> Vec<OsString> {
    [
        "--stack",
        system.stack(),
        "--model",
        model.name(),
        "--abandoned",
        "serve",
    ]
    .map(OsString::from)
    .to_vec()
}

/// Envoy's settings for [`System::Envoy`]: the adaptive concurrency filter, no retries,
/// and Envoy's own default of one worker per core (`--concurrency`, the machine's hardware
/// threads): the issue asks for defaults, and one worker could itself be the bottleneck at
/// 100x (20 000 to 30 000 req/s through one thread), which would be charged to the filter.
/// Envoy's defaults otherwise.
pub fn envoy_settings() -> ProxySettings {
    ProxySettings {
        retry: None,
        workers: u32::try_from(super::cpu::cores()).unwrap_or(u32::MAX),
        adaptive_concurrency: true,
        ..ProxySettings::default()
    }
}

/// The body of the `503` with which Envoy's adaptive concurrency filter sheds a request:
/// only these are rejections; Envoy's other `503`s (upstream connect errors, overflows, no
/// healthy upstream) are failures.
pub const ENVOY_REJECTION_BODY: &str = "reached concurrency limit";

/// Envoy's counter of the requests its adaptive concurrency filter blocked (answered with
/// [`ENVOY_REJECTION_BODY`]), on the `ingress` listener the bench configures.
pub const ENVOY_BLOCKED_STAT: &str =
    "http.ingress.adaptive_concurrency.gradient_controller.rq_blocked";

/// One system, started fresh for one point; stopped by [`Running::stop`] or when dropped.
#[derive(Debug)]
pub struct Running {
    server: ServerProcess,
    envoy: Option<EnvoyProxy>,
    url: Uri,
}

impl Running {
    /// Starts `system` on `model`: a `demo-server` on a free port of 127.0.0.1 and, for
    /// [`System::Envoy`], an Envoy in front of it (its files in `dir`), each ready before
    /// this returns.
    ///
    /// # Errors
    ///
    /// When a process cannot start or is not ready in time, or Envoy is needed and
    /// `programs.envoy` is `None`.
    pub async fn start(
        system: System,
        model: Model,
        programs: &Programs,
        dir: &Path,
    ) -> Result<Self, BoxError> {
        let server = ServerProcess::start(&programs.server, &server_args(system, model), None)
            .await
            .map_err(|e| format!("{system} on {model}: {e}"))?;
        let envoy = if system == System::Envoy {
            let program = programs
                .envoy
                .as_deref()
                .ok_or("the envoy system needs an envoy executable")?;
            let proxy = EnvoyProxy::start(program, dir, &envoy_settings(), &[server.addr()])
                .await
                .map_err(|e| format!("{system} on {model}: {e}"))?;
            Some(proxy)
        } else {
            None
        };
        let addr = envoy.as_ref().map_or(server.addr(), EnvoyProxy::addr);
        let url = format!("http://{addr}/api").parse()?;
        Ok(Self { server, envoy, url })
    }

    /// The URL the load goes to.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// How the system's processes ended, if one of them has exited: the server's or
    /// Envoy's exit status (and Envoy's log); `None` while both run. A process that exited
    /// during a point makes the point a harness failure, not a result.
    pub fn exited(&mut self) -> Option<String> {
        if let Ok(Some(status)) = self.server.try_wait() {
            return Some(format!("demo-server exited ({status})"));
        }
        let envoy = self.envoy.as_mut()?;
        match envoy.try_wait() {
            Ok(Some(status)) => Some(format!(
                "envoy exited ({status}); its log:\n{}",
                envoy.log_text().trim()
            )),
            _ => None,
        }
    }

    /// Envoy's count of the requests its adaptive concurrency filter blocked
    /// ([`ENVOY_BLOCKED_STAT`]); `None` without an Envoy.
    ///
    /// # Errors
    ///
    /// When Envoy's admin interface does not answer within 5 s.
    pub async fn envoy_blocked(&self) -> Result<Option<u64>, BoxError> {
        match &self.envoy {
            Some(envoy) => Ok(Some(envoy.stats().await?.get(ENVOY_BLOCKED_STAT))),
            None => Ok(None),
        }
    }

    /// The server's process id.
    pub fn server_pid(&self) -> i32 {
        self.server.pausable().pid()
    }

    /// Kills Envoy (if any) and the server, by their process ids, and waits for them.
    pub async fn stop(self) -> std::io::Result<()> {
        if let Some(envoy) = self.envoy {
            envoy.shutdown().await?;
        }
        self.server.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systems_and_models_are_named_as_the_command_line_names_them() {
        for system in System::ALL {
            assert_eq!(system.name().parse::<System>(), Ok(system));
        }
        for model in Model::ALL {
            assert_eq!(model.name().parse::<Model>(), Ok(model));
        }
        let e = "envoy-ac".parse::<System>().unwrap_err();
        assert!(
            e.contains("unknown system `envoy-ac`; one of bare, full"),
            "{e}"
        );
        assert!("instant".parse::<Model>().is_err());
    }

    #[test]
    fn envoy_and_bare_run_the_bare_server_and_peers_their_own_stack() {
        let args = |s, m| {
            server_args(s, m)
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            args(System::Envoy, Model::Mmc),
            "--stack none --model mmc --abandoned serve"
        );
        assert_eq!(
            args(System::Bare, Model::Article),
            "--stack none --model article --abandoned serve"
        );
        assert_eq!(
            args(System::TowerResilience, Model::Mmc),
            "--stack tower-resilience --model mmc --abandoned serve"
        );
        let envoy = envoy_settings();
        assert!(envoy.adaptive_concurrency && envoy.retry.is_none());
        // Review S6: Envoy's default, a worker per core.
        assert_eq!(envoy.workers as usize, super::super::cpu::cores());
    }
}
