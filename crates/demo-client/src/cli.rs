//! The command line of the `demo-client` binary.
//!
//! The flag names of `run` (`--clients`, `--think-time`, `--url`, `--timeout`,
//! `--strategy`) are a public interface: people script against them.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use http::Uri;

use crate::client::Abandoned;
use crate::duration::parse_duration;
use crate::experiment::{InvalidTiming, RunSpec, Timing};
use crate::load::{InvalidLoad, LoadConfig};
use crate::strategy::Strategy;

/// The demo load generator and the pause-and-resume outage experiment.
#[derive(Debug, Parser)]
#[command(name = "demo-client", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send load to a server until Ctrl-C, printing a status line every 5 seconds.
    Run(RunArgs),
    /// The outage experiment against real `demo-server` processes: steady state, SIGSTOP,
    /// SIGCONT, observation; one run per strategy; a table, a CSV and an SVG plot.
    Scenario(ScenarioArgs),
    /// The same experiment in virtual time, in process: the demo server's model and
    /// middleware behind the real client layers, a paused clock and seeded randomness.
    Simulate(SimulateArgs),
    /// The article's figure: retry delay against attempt number for its two parameter
    /// sets, in linear and log scale, as SVG.
    PlotDelays(PlotDelaysArgs),
}

/// The clients: how many, how often, how patient.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Number of concurrent clients.
    #[arg(long, default_value = "1000")]
    pub clients: NonZeroUsize,
    /// Mean of each client's exponential think time between requests (e.g. 10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub think_time: Duration,
    /// Timeout of each attempt (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Seed of the clients' think times and of the retry jitter.
    #[arg(long, default_value = "1")]
    pub seed: u64,
}

impl LoadArgs {
    /// The load generator's configuration for `url`.
    pub fn load_config(&self, url: Uri) -> Result<LoadConfig, InvalidLoad> {
        LoadConfig::new(self.clients, self.think_time, url, self.seed)
    }

    /// The per-attempt timeout, checked: greater than zero.
    pub fn attempt_timeout(&self) -> Result<Duration, InvalidLoad> {
        if self.timeout.is_zero() {
            Err(InvalidLoad::new("the timeout must be greater than zero"))
        } else {
            Ok(self.timeout)
        }
    }
}

/// `demo-client run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The clients.
    #[command(flatten)]
    pub load: LoadArgs,
    /// The URL every request goes to.
    #[arg(long, default_value = crate::load::DEFAULT_URL)]
    pub url: Uri,
    /// How clients retry: fixed, exponential or full.
    #[arg(long, default_value = "full")]
    pub strategy: Strategy,
    /// Stop after this long instead of at Ctrl-C.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
}

/// The experiment's shape, shared by `scenario` and `simulate`.
#[derive(Debug, Clone, Args)]
pub struct ExperimentArgs {
    /// The clients.
    #[command(flatten)]
    pub load: LoadArgs,
    /// Steady state before the pause, in whole seconds.
    #[arg(long, default_value = "15s", value_parser = parse_duration, conflicts_with = "quick")]
    pub steady: Duration,
    /// Length of the pause (SIGSTOP to SIGCONT), in whole seconds.
    #[arg(long, default_value = "20s", value_parser = parse_duration, conflicts_with = "quick")]
    pub pause: Duration,
    /// Observation after resume, in whole seconds.
    #[arg(long, default_value = "60s", value_parser = parse_duration, conflicts_with = "quick")]
    pub observe: Duration,
    /// A short run of the same comparison: 3 s steady, 5 s paused, 10 s observed.
    #[arg(long)]
    pub quick: bool,
    /// The runs, as STRATEGY:STACK, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fixed:none,exponential:none,full:full"
    )]
    pub runs: Vec<RunSpec>,
    /// Directory for the CSV and the SVG plot.
    #[arg(long, default_value = "target/scenario")]
    pub out: PathBuf,
}

impl ExperimentArgs {
    /// The phases, `--quick` applied.
    pub fn timing(&self) -> Result<Timing, InvalidTiming> {
        if self.quick {
            Ok(Timing::QUICK)
        } else {
            Timing::new(self.steady, self.pause, self.observe)
        }
    }
}

/// `demo-client scenario`.
#[derive(Debug, Clone, Args)]
pub struct ScenarioArgs {
    /// The experiment.
    #[command(flatten)]
    pub experiment: ExperimentArgs,
    /// Drive an already running server at this URL instead of starting `demo-server`
    /// children (needs --pause-pid; --runs then only chooses the client strategies).
    #[arg(long, requires = "pause_pid")]
    pub url: Option<Uri>,
    /// The process id to SIGSTOP and SIGCONT when driving a server given by --url.
    #[arg(long, requires = "url")]
    pub pause_pid: Option<i32>,
    /// The `demo-server` executable; by default the one next to this executable.
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// An extra argument for every `demo-server` child (repeat for several).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
}

/// What the simulated server does with a request whose client gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AbandonedArg {
    /// Serve it to the end, as the article's server does.
    Serve,
    /// Drop it as soon as the server runs, as a hyper server does.
    Cancel,
}

impl From<AbandonedArg> for Abandoned {
    fn from(a: AbandonedArg) -> Self {
        match a {
            AbandonedArg::Serve => Abandoned::Serve,
            AbandonedArg::Cancel => Abandoned::Cancel,
        }
    }
}

/// `demo-client simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The experiment.
    #[command(flatten)]
    pub experiment: ExperimentArgs,
    /// What the server does with a request whose client gave up: `serve` it to the end (the
    /// article's server) or `cancel` it once the server runs (hyper, so the real
    /// `demo-server`).
    #[arg(long, value_enum, default_value = "serve")]
    pub abandoned: AbandonedArg,
}

/// `demo-client plot-delays`.
#[derive(Debug, Clone, Args)]
pub struct PlotDelaysArgs {
    /// Number of retries to plot.
    #[arg(long, default_value = "15")]
    pub retries: u32,
    /// Seed of the jitter.
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// Directory for the SVG.
    #[arg(long, default_value = "target/scenario")]
    pub out: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("demo-client").chain(args.iter().copied()))
    }

    #[test]
    fn run_defaults_are_the_articles() {
        let Command::Run(run) = parse(&["run"]).unwrap().command else {
            panic!("not run");
        };
        assert_eq!(run.load.clients.get(), 1000);
        assert_eq!(run.load.think_time, Duration::from_secs(10));
        assert_eq!(run.load.timeout, Duration::from_secs(2));
        assert_eq!(run.url, Uri::from_static("http://127.0.0.1:8070/api"));
        assert_eq!(run.strategy, Strategy::Full);
        assert_eq!(run.duration, None);
    }

    #[test]
    fn run_flags_keep_their_names() {
        let cli = parse(&[
            "run",
            "--clients",
            "10",
            "--think-time",
            "500ms",
            "--url",
            "http://127.0.0.1:9/x",
            "--timeout",
            "1m",
            "--strategy",
            "fixed",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run");
        };
        assert_eq!(run.load.clients.get(), 10);
        assert_eq!(run.load.think_time, Duration::from_millis(500));
        assert_eq!(run.load.timeout, Duration::from_secs(60));
        assert_eq!(run.strategy, Strategy::Fixed);
    }

    #[test]
    fn bad_values_are_explained() {
        let err = parse(&["run", "--think-time", "10"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("it has no unit"), "{err}");
        let err = parse(&["run", "--strategy", "random"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected fixed, exponential or full"), "{err}");
        let err = parse(&["run", "--clients", "0"]).unwrap_err().to_string();
        assert!(err.contains("--clients"), "{err}");
        let err = parse(&["scenario", "--runs", "fixed"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("STRATEGY:STACK"), "{err}");
        assert!(parse(&["scenario", "--quick", "--pause", "5s"]).is_err());
        assert!(parse(&["scenario", "--url", "http://127.0.0.1:1/"]).is_err());
        assert!(parse(&["scenario", "--pause-pid", "12"]).is_err());
    }

    #[test]
    fn scenario_defaults_and_quick() {
        let Command::Scenario(s) = parse(&["scenario"]).unwrap().command else {
            panic!("not scenario");
        };
        assert_eq!(s.experiment.timing(), Ok(Timing::DEFAULT));
        assert_eq!(s.experiment.runs, RunSpec::DEFAULT.to_vec());
        assert_eq!(s.experiment.out, PathBuf::from("target/scenario"));
        let Command::Simulate(q) = parse(&["simulate", "--quick"]).unwrap().command else {
            panic!("not simulate");
        };
        assert_eq!(Abandoned::from(q.abandoned), Abandoned::Serve);
        let q = q.experiment;
        assert_eq!(q.timing(), Ok(Timing::QUICK));
        let Command::Scenario(s) = parse(&[
            "scenario",
            "--url",
            "http://127.0.0.1:1/api",
            "--pause-pid",
            "42",
            "--server-arg=--rate-limit",
            "--server-arg",
            "50",
        ])
        .unwrap()
        .command
        else {
            panic!("not scenario");
        };
        assert_eq!(s.pause_pid, Some(42));
        assert_eq!(s.server_args, ["--rate-limit", "50"]);
    }

    #[test]
    fn plot_delays_defaults() {
        let Command::PlotDelays(p) = parse(&["plot-delays"]).unwrap().command else {
            panic!("not plot-delays");
        };
        assert_eq!((p.retries, p.seed), (15, 1));
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
