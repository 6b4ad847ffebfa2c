//! `demo-client spike`'s arguments, and the command itself.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tower::BoxError;

use crate::bench::open_loop::Arrivals;
use crate::bench::system::{Model, System};
use crate::duration::parse_duration;
use crate::process::find_server;
use crate::spike::figures::RowFigures;
use crate::spike::simulated::simulate_row;
use crate::spike::tiers::run_row;
use crate::spike::{RowSpec, SpikePlan, table};

pub(super) const SPIKE_ABOUT: &str = "\
The spike experiment. Steady `critical` traffic at half the server's capacity throughout;
after the warm-up, a `sheddable` spike at ten times the capacity for 30 s; two open-loop
streams (Poisson arrivals from --seed, or evenly spaced with --even; never waiting for
answers), each request given --timeout from its scheduled instant. Each row starts its
servers fresh on 127.0.0.1 (demo-server --model M --stack S --abandoned serve; with --tiers
3, three of them chained with --downstream, the client calling the top one) and runs the
load twice:

  class-blind        no X-Request-Criticality: every request is the server's default level,
                     critical, so the limits cannot tell the spike from the steady traffic
                     (the behaviour of a server before criticality);
  criticality-aware  each request carries its level in X-Request-Criticality, set only at
                     the client: a lower tier gets it only if the libraries carry it
                     (no handler copies it).

Per row and level (the generator knows each request's stream in both rows): the success
rate and the p99 of the served requests scheduled during the spike, the p99 of the critical
requests served during the warm-up (unloaded, its first second left out) and their ratio,
the counts; and how many /api requests the bottom tier's handler (the only one's, with one
tier) ran at each level (read from its /metrics: demo_server_handler_criticality_total). The Markdown table on
stdout, one progress line per row on stderr; in --out, spike.csv, spike-timeline.csv (served
per second and level) and spike.svg (the same, a panel per row).

The issue's target, with criticality: critical success at least 99.5 % during the spike and
its p99 at most 2x the unloaded one, while sheddable is shed; class-blind, critical success
far lower.

Examples:
  demo-client spike                                  # 8 rows of 40 s: about 6 minutes
  demo-client spike --stacks full --tiers 1          # two rows
  demo-client spike --spike 10s --spike-factor 5 --warmup 5s
  demo-client spike --simulate                       # one tier, virtual time, seconds

With --simulate, the one-tier rows run in virtual time, in process: demo-server's application
and middleware called directly under tokio's paused clock (no processes, no connections, no
CPU contention; a seed gives the same figures).";

/// `demo-client spike`.
#[derive(Debug, Clone, Args)]
pub struct SpikeArgs {
    /// The latency model of every server: mmc (the paper's M/M/10, capacity 200 req/s;
    /// `--stack full` limits it to 183 req/s) or article (300 req/s nominal; `--stack full`
    /// limits it to 250 req/s).
    #[arg(long, default_value = "mmc")]
    pub model: Model,
    /// The server stacks, comma-separated: full, adaptive.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "full,adaptive"
    )]
    pub stacks: Vec<System>,
    /// The topologies, comma-separated: 1 (one server) and 3 (three chained).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "1,3"
    )]
    pub tiers: Vec<usize>,
    /// The steady critical rate as a share of the model's capacity.
    #[arg(long, value_name = "SHARE", default_value_t = 0.5)]
    pub steady_share: f64,
    /// The sheddable spike's rate as a multiple of the model's capacity.
    #[arg(long, value_name = "FACTOR", default_value_t = 10.0)]
    pub spike_factor: f64,
    /// Steady traffic alone before the spike; at least 2s.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// How long the spike lasts; at least 1s.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub spike: Duration,
    /// Each request's timeout, from its scheduled instant.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// The generator's cap on requests in flight: an arrival over it is not sent, and is
    /// counted as dropped.
    #[arg(long, value_name = "N", default_value_t = NonZeroUsize::new(8192).expect("not zero"))]
    pub max_in_flight: NonZeroUsize,
    /// Run one-tier rows in virtual time, in process (demo-server's application and
    /// middleware called directly under a paused clock; no processes, no connections) instead
    /// of against real processes; --tiers 3 is left out (a tier's downstream call is real
    /// HTTP).
    #[arg(long)]
    pub simulate: bool,
    /// The seed of the arrivals (two Poisson processes, the spike's from the next seed)
    /// and, with --simulate, of the M/M/c model's service times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Space each stream's arrivals evenly instead of as a Poisson process. Even streams
    /// lock in phase with a token bucket's refills (every critical arrival comes with
    /// sheddable ones at the same instant), which skews the class-blind figures.
    #[arg(long)]
    pub even: bool,
    /// The demo-server executable [default: next to demo-client].
    #[arg(long = "server-bin", value_name = "PATH")]
    pub server_bin: Option<PathBuf>,
    /// Directory for spike.csv, spike-timeline.csv and spike.svg.
    #[arg(long, default_value = "target/spike")]
    pub out: PathBuf,
}

impl SpikeArgs {
    /// The plan and the rows, every setting checked.
    ///
    /// # Errors
    ///
    /// A message naming the setting, when one cannot work.
    pub fn plan(&self) -> Result<(SpikePlan, Vec<RowSpec>), String> {
        if let Some(bad) = self
            .stacks
            .iter()
            .find(|s| !matches!(s, System::Full | System::Adaptive))
        {
            return Err(format!(
                "--stacks: the spike runs full or adaptive, not {bad}"
            ));
        }
        if let Some(bad) = self.tiers.iter().find(|&&t| t != 1 && t != 3) {
            return Err(format!("--tiers: 1 or 3, not {bad}"));
        }
        if self.stacks.is_empty() || self.tiers.is_empty() {
            return Err("--stacks and --tiers must each name at least one".to_owned());
        }
        let plan = SpikePlan::new(self.model.capacity())
            .and_then(|p| p.steady_share(self.steady_share))
            .and_then(|p| p.spike_factor(self.spike_factor))
            .and_then(|p| p.warmup(self.warmup))
            .and_then(|p| p.spike(self.spike))
            .and_then(|p| p.timeout(self.timeout))
            .and_then(|p| p.max_in_flight(self.max_in_flight.get()))
            .map_err(|e| e.to_string())?
            .spacing(if self.even {
                Arrivals::Fixed
            } else {
                Arrivals::Poisson { seed: self.seed }
            });
        let tiers: Vec<usize> = if self.simulate {
            self.tiers.iter().copied().filter(|&t| t == 1).collect()
        } else {
            self.tiers.clone()
        };
        if tiers.is_empty() {
            return Err("--simulate runs one tier: give --tiers 1".to_owned());
        }
        Ok((plan, RowSpec::all(&self.stacks, &tiers)))
    }

    /// Runs the experiment: every row in turn, a progress line each on stderr, the table
    /// on stdout, the files in `--out`.
    ///
    /// # Errors
    ///
    /// When a setting cannot work, `demo-server` is not found or cannot start, or the
    /// files cannot be written.
    pub async fn run(self) -> Result<(), BoxError> {
        let (plan, rows) = self.plan()?;
        if self.simulate && self.tiers.contains(&3) {
            eprintln!("--simulate: one tier only (a tier's downstream call is real HTTP)");
        }
        let server = if self.simulate {
            None
        } else {
            Some(find_server(self.server_bin.as_deref()).ok_or(
                "no demo-server next to demo-client; build it (cargo build --release -p \
                 demo-server) or give --server-bin",
            )?)
        };
        std::fs::create_dir_all(&self.out)?;
        let (max_in_flight, lowered) =
            crate::bench::limits::fit_in_flight(self.max_in_flight.get());
        if let Some(message) = lowered {
            eprintln!("{message}");
        }
        let plan = plan.max_in_flight(max_in_flight)?;
        let mut figures: Vec<RowFigures> = Vec::with_capacity(rows.len());
        for spec in rows {
            let row = match &server {
                Some(server) => run_row(server, self.model, spec, &plan).await?,
                None => {
                    let (model, plan, seed) = (self.model, plan.clone(), self.seed);
                    tokio::task::spawn_blocking(move || simulate_row(model, spec, &plan, seed))
                        .await??
                }
            };
            let [critical, sheddable] = &row.levels;
            let pct = |r: Option<f64>| r.map_or(f64::NAN, |r| r * 100.0);
            eprintln!(
                "{}: critical {:.2} % (p99 {:?}, unloaded {:?}), sheddable {:.2} %",
                spec.label(),
                pct(critical.success_rate()),
                critical.p99,
                critical.unloaded_p99,
                pct(sheddable.success_rate()),
            );
            figures.push(row);
        }
        println!(
            "# demo-client spike ({} model{})\n\n{}",
            self.model,
            if self.simulate { ", simulated" } else { "" },
            table::markdown(&plan, &figures)
        );
        std::fs::write(self.out.join("spike.csv"), table::csv(&figures))?;
        std::fs::write(
            self.out.join("spike-timeline.csv"),
            table::timeline_csv(&figures),
        )?;
        std::fs::write(self.out.join("spike.svg"), table::svg(&plan, &figures))?;
        eprintln!(
            "wrote spike.csv, spike-timeline.csv and spike.svg in {}",
            self.out.display()
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};
    use crate::spike::Awareness;

    use super::*;

    fn spike(args: &[&str]) -> Result<SpikeArgs, clap::Error> {
        let cli = Cli::try_parse_from(["demo-client", "spike"].iter().chain(args).copied())?;
        let Command::Spike(args) = cli.command else {
            panic!("not the spike command");
        };
        Ok(args)
    }

    #[test]
    fn the_defaults_are_the_issues_spike_against_both_stacks_and_both_topologies() {
        let (plan, rows) = spike(&[]).unwrap().plan().unwrap();
        assert!((plan.capacity() - 200.0).abs() < 1e-9, "mmc");
        assert_eq!((plan.steady(), plan.spike_rate()), (100.0, 2000.0));
        assert_eq!(
            (plan.warmup_len(), plan.spike_len()),
            (Duration::from_secs(10), Duration::from_secs(30))
        );
        assert_eq!(rows.len(), 8);
        assert_eq!(rows[0].awareness, Awareness::ClassBlind);
        assert_eq!(rows[1].awareness, Awareness::Aware);
    }

    #[test]
    fn the_figures_can_be_changed_and_what_cannot_work_is_refused() {
        let args = spike(&[
            "--model",
            "article",
            "--stacks",
            "full",
            "--tiers",
            "3",
            "--steady-share",
            "0.25",
            "--spike-factor",
            "5",
            "--warmup",
            "3s",
            "--spike",
            "5s",
        ])
        .unwrap();
        let (plan, rows) = args.plan().unwrap();
        assert_eq!((plan.steady(), plan.spike_rate()), (75.0, 1500.0));
        assert_eq!(plan.total(), Duration::from_secs(8));
        assert_eq!(rows.len(), 2);
        assert!(
            rows.iter()
                .all(|r| r.tiers == 3 && r.system == System::Full)
        );
        let refused = |args: &[&str]| spike(args).unwrap().plan().unwrap_err();
        assert!(refused(&["--stacks", "bare"]).contains("full or adaptive"));
        assert!(refused(&["--tiers", "2"]).contains("1 or 3"));
        assert!(refused(&["--warmup", "1s"]).contains("warm-up"));
        assert!(refused(&["--spike-factor", "0"]).contains("spike factor"));
        assert!(spike(&["--stacks", "nonesuch"]).is_err());
        let (_, simulated) = spike(&["--simulate"]).unwrap().plan().unwrap();
        assert!(simulated.iter().all(|r| r.tiers == 1) && simulated.len() == 4);
        assert!(refused(&["--simulate", "--tiers", "3"]).contains("one tier"));
        let (even, _) = spike(&["--even"]).unwrap().plan().unwrap();
        assert_eq!(even.arrivals().len(), 10 * 100 + 30 * 100 + 30 * 2000);
    }
}
