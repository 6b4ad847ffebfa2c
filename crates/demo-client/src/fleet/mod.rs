//! The outage experiment in the paper's topology (`demo-client fleet`): three `demo-server`
//! processes behind a balancer of our own, HAProxy or Envoy ([`FleetBalancer`]), one of them
//! stopped (SIGSTOP) while the other two carry on, then resumed.
//!
//! It reuses the scenario's machinery (the processes, the recorder, the phases, the table,
//! the CSV and the plot) and adds what only a fleet has: what each survivor served, rejected
//! and told to stop during the outage, the retry share its overload layer saw, and the
//! balancer's own view of every server ([`BalancerView`]: HAProxy's [`ServerStats`], or
//! Envoy's counters, [`EnvoyView`]).

mod balancer;
mod haproxy;
mod survivors;

use std::ffi::OsString;
use std::fs::{self, File};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use overload_core::clock::{SystemWallClock, WallClock};
use tower::BoxError;

pub use balancer::{BalancerView, EnvoyHost, EnvoyView, FleetBalancer};
pub use haproxy::{
    Balancer, BalancerSettings, INSTALL_HINT, ServerStats, config as haproxy_config, find_haproxy,
};
pub use survivors::{FleetRecord, Survivor, SurvivorTable};

use crate::drive::{PauseGuard, Progress, drive_phases};
use crate::experiment::{RunSpec, Timing};
use crate::load::{LoadConfig, spawn_clients};
use crate::output::RunRecord;
use crate::process::ServerProcess;
use crate::record::Recorder;
use crate::scenario::{metrics_url, spawn_sampler};
use crate::stack::network_stack;

/// The number of servers in the fleet: three, the smallest fleet in which losing one leaves
/// neighbours to take its load.
pub const SERVERS: usize = 3;

/// One run of the fleet experiment, besides its spec.
#[derive(Debug, Clone)]
pub struct FleetRun<'a> {
    /// The phases; the pause is the outage of the first server.
    pub timing: Timing,
    /// The clients.
    pub clients: NonZeroUsize,
    /// The mean think time.
    pub think_time: Duration,
    /// The per-attempt timeout.
    pub timeout: Duration,
    /// The cap on a response body, in bytes.
    pub max_body: usize,
    /// The seed of think times and jitter.
    pub seed: u64,
    /// The `demo-server` executable.
    pub server: &'a Path,
    /// Arguments for every server, after `--stack` (which the run sets).
    pub server_args: &'a [OsString],
    /// The balancer in front of the servers, with its executable and settings.
    pub balancer: FleetBalancer<'a>,
    /// One server's capacity in requests per second, to judge what the survivors served.
    pub capacity: f64,
    /// Where the servers' and the balancer's logs and configuration go.
    pub dir: &'a Path,
}

/// Runs `spec` against a fresh fleet: start three servers and the balancer in front of
/// them, send load to the balancer, stop the first server for the pause, resume it, observe,
/// and stop everything (on every exit path, including when this future is dropped).
pub async fn fleet_run(
    spec: RunSpec,
    run: &FleetRun<'_>,
    progress: &mut Progress,
) -> Result<FleetRecord, BoxError> {
    let label = spec.label();
    let dir = run
        .dir
        .join(format!("{}-{}", spec.strategy, spec.stack.name()));
    fs::create_dir_all(&dir)?;
    let mut args: Vec<OsString> = vec!["--stack".into(), spec.stack.name().into()];
    args.extend(run.server_args.iter().cloned());
    let mut servers = Vec::with_capacity(SERVERS);
    for i in 1..=SERVERS {
        let log_path = dir.join(format!("server-s{i}.log"));
        let log = File::create(&log_path)?;
        match ServerProcess::start(run.server, &args, Some(log)).await {
            Ok(server) => servers.push(server),
            Err(e) => {
                let said = fs::read_to_string(&log_path).unwrap_or_default();
                return Err(format!("server s{i}: {e}\n{}", said.trim()).into());
            }
        }
    }
    let addrs: Vec<_> = servers.iter().map(ServerProcess::addr).collect();
    let balancer = run.balancer.start(&dir, &addrs).await?;
    let url: Uri = format!("http://{}/api", balancer.addr()).parse()?;
    let load = LoadConfig::new(run.clients, run.think_time, url, run.seed)?;
    let server_metrics = addrs
        .iter()
        .map(|a| metrics_url(&format!("http://{a}/api").parse::<Uri>()?).map_err(BoxError::from))
        .collect::<Result<Vec<_>, _>>()?;

    let recorder = Recorder::new();
    let stack = network_stack(
        spec.strategy,
        run.clients.get(),
        run.timeout,
        run.max_body,
        run.seed,
        &(Arc::new(SystemWallClock) as Arc<dyn WallClock>),
        &recorder,
    )?;
    let clients = spawn_clients(&stack, &load, &recorder);
    // NOTE: the concurrency column sums the survivors' (the stopped server cannot answer).
    let sampler = spawn_sampler(server_metrics[1..].to_vec(), recorder.clone());
    let scraper = survivors::spawn_scraper(server_metrics[1..].to_vec(), recorder.start());

    let mut target = PauseGuard::new(servers[0].pausable());
    let driven = drive_phases(&recorder, run.timing, &mut target, progress).await;
    progress.finish_run();
    let end = recorder.start() + run.timing.total();
    let unfinished = clients.stop(end).await;
    sampler.abort();
    drop(target);
    let stats = balancer.view(&addrs).await;
    balancer.shutdown().await?;
    let scrapes = scraper.finish().await;
    for server in servers {
        server.shutdown().await?;
    }
    driven?;
    let phases = run.timing.phases();
    let settle = run.balancer.detection_secs();
    let survivors = scrapes
        .iter()
        .enumerate()
        .map(|(i, series)| {
            Survivor::compute(format!("s{}", i + 2), series, phases, settle, run.capacity)
        })
        .collect();
    Ok(FleetRecord {
        run: RunRecord::new(
            label,
            recorder.seconds_until(phases.end()),
            unfinished,
            phases,
        ),
        survivors,
        balancer: stats?,
    })
}

/// Writes the scenario's outputs under the name `fleet` (`fleet.csv`, `fleet.svg`,
/// `fleet.txt`), with the survivors' table and the balancer's view appended to the text, and
/// `fleet-survivors.csv`; returns the paths.
pub fn write_fleet_outputs(dir: &Path, records: &[FleetRecord]) -> std::io::Result<Vec<PathBuf>> {
    let runs: Vec<RunRecord> = records.iter().map(|r| r.run.clone()).collect();
    let [csv, svg, txt] = crate::scenario::write_outputs(dir, "fleet", &runs)?;
    let mut text = fs::read_to_string(&txt)?;
    text.push('\n');
    text.push_str(&SurvivorTable(records).to_string());
    fs::write(&txt, text)?;
    let survivors = dir.join("fleet-survivors.csv");
    fs::write(&survivors, survivors::survivors_csv(records))?;
    Ok(vec![csv, svg, txt, survivors])
}
