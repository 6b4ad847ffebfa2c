//! `demo-client`: the demo load generator and the pause-and-resume outage experiment.
//!
//! See `demo-client --help` and the crate's README.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use demo_client::cli::{
    Cli, Command, ExperimentArgs, PlotDelaysArgs, RunArgs, ScenarioArgs, SimulateArgs,
};
use demo_client::client::http_transport;
use demo_client::drive::Progress;
use demo_client::load::{spawn_clients, status_line};
use demo_client::output::{RunRecord, delays_svg};
use demo_client::process::{Pausable, find_server};
use demo_client::record::{Recorder, Second};
use demo_client::report::{Table, percentile};
use demo_client::scenario::{RealRun, Target, real_run, write_outputs};
use demo_client::simulate::{SimulatedRun, simulate_run};
use demo_client::stack::client_stack;
use tower::BoxError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => runtime().and_then(|rt| rt.block_on(run(args))),
        Command::Scenario(args) => runtime().and_then(|rt| rt.block_on(scenario(args))),
        Command::Simulate(args) => simulate(&args),
        Command::PlotDelays(args) => plot_delays(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo-client: {e}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, BoxError> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = async {
            match term.as_mut() {
                Some(t) => { t.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => {}
    }
}

async fn run(args: RunArgs) -> Result<(), BoxError> {
    let load = args.load.load_config(args.url.clone())?;
    let timeout = args.load.attempt_timeout()?;
    let recorder = Recorder::new();
    let stack = client_stack(
        http_transport(load.clients()),
        args.strategy,
        timeout,
        load.seed(),
        &recorder,
    );
    eprintln!(
        "{} clients, think time {:?} (about {:.0} req/s), timeout {timeout:?}, strategy {}, to {}; Ctrl-C stops",
        load.clients(),
        load.think_time(),
        load.offered_rate(),
        args.strategy,
        load.url()
    );
    let clients = spawn_clients(&stack, &load, &recorder);
    let start = recorder.start();
    let deadline = args.duration.map(|d| start + d);
    let report = async {
        let mut next = start + Duration::from_secs(5);
        loop {
            if deadline.is_some_and(|d| d <= next) {
                tokio::time::sleep_until(deadline.unwrap_or(next)).await;
                return;
            }
            tokio::time::sleep_until(next).await;
            let secs = usize::try_from((next - start).as_secs()).unwrap_or(usize::MAX);
            println!("{}", status_line(&recorder.totals(secs - 5, secs), 5));
            next += Duration::from_secs(5);
        }
    };
    tokio::select! {
        () = report => {}
        () = shutdown_signal() => eprintln!("stopping"),
    }
    drop(clients);
    let elapsed = start.elapsed();
    let total = recorder.totals(0, usize::MAX);
    print_summary(&total, elapsed);
    Ok(())
}

fn print_summary(total: &Second, elapsed: Duration) {
    let mut latencies = total.latencies.clone();
    latencies.sort_unstable();
    let ms = |q| {
        percentile(&latencies, q)
            .map_or_else(|| "-".to_owned(), |d| format!("{} ms", d.as_millis()))
    };
    println!(
        "summary after {:.1} s: {} requests, {} OK, {} errors, {} timed out; {} attempts, {} retries, {} budget refusals, {} stop signals; p50 {}, p99 {}",
        elapsed.as_secs_f64(),
        total.requests,
        total.ok,
        total.errors,
        total.timeouts,
        total.attempts,
        total.retries,
        total.budget_refusals,
        total.stop_signals,
        ms(0.5),
        ms(0.99),
    );
}

fn print_and_write(args: &ExperimentArgs, name: &str, runs: &[RunRecord]) -> Result<(), BoxError> {
    let reports: Vec<_> = runs.iter().map(|r| r.report.clone()).collect();
    println!("{}", Table(&reports));
    let paths = write_outputs(&args.out, name, runs)?;
    for p in paths {
        println!("wrote {}", p.display());
    }
    std::io::stdout().flush()?;
    Ok(())
}

async fn scenario(args: ScenarioArgs) -> Result<(), BoxError> {
    let experiment = &args.experiment;
    let timing = experiment.timing()?;
    let timeout = experiment.load.attempt_timeout()?;
    let target = match (&args.url, args.pause_pid) {
        (Some(url), Some(pid)) => Target::External {
            url: url.clone(),
            pid: Pausable::from_pid(pid).ok_or("--pause-pid must be a positive process id")?,
        },
        _ => {
            let program = find_server(args.server_bin.as_deref()).ok_or(
                "cannot find the demo-server executable next to this one: build it with \
                 `cargo build --release -p demo-server` or pass --server-bin",
            )?;
            Target::Spawn {
                program,
                args: args.server_args.iter().map(OsString::from).collect(),
            }
        }
    };
    std::fs::create_dir_all(&experiment.out)?;
    let run = RealRun {
        timing,
        clients: experiment.load.clients,
        think_time: experiment.load.think_time,
        timeout,
        seed: experiment.load.seed,
        target: &target,
        log_dir: Some(&experiment.out),
    };
    let total = timing.total() * u32::try_from(experiment.runs.len()).unwrap_or(u32::MAX);
    eprintln!(
        "{} runs of {} s each ({} s steady, {} s paused, {} s observed): about {} s",
        experiment.runs.len(),
        timing.total().as_secs(),
        timing.steady().as_secs(),
        timing.pause().as_secs(),
        timing.observe().as_secs(),
        total.as_secs()
    );
    let mut progress = Progress::new(true);
    let mut done = Vec::new();
    let runs = async {
        for (i, spec) in experiment.runs.iter().enumerate() {
            progress.start_run(i + 1, experiment.runs.len(), &spec.label());
            done.push(real_run(*spec, &run, &mut progress).await?);
        }
        Ok::<(), BoxError>(())
    };
    let outcome = tokio::select! {
        r = runs => r,
        () = shutdown_signal() => Err("interrupted: the demo-server children were killed".into()),
    };
    if !done.is_empty() {
        print_and_write(experiment, "scenario", &done)?;
    }
    outcome
}

fn simulate(args: &SimulateArgs) -> Result<(), BoxError> {
    let experiment = &args.experiment;
    let timing = experiment.timing()?;
    let timeout = experiment.load.attempt_timeout()?;
    let load = experiment
        .load
        .load_config(demo_client::load::DEFAULT_URL.parse()?)?;
    let mut progress = Progress::new(true);
    let mut done = Vec::new();
    for (i, spec) in experiment.runs.iter().enumerate() {
        progress.start_run(i + 1, experiment.runs.len(), &spec.label());
        let run = SimulatedRun {
            timing,
            load: load.clone(),
            timeout,
            abandoned: args.abandoned.into(),
        };
        done.push(simulate_run(*spec, &run, &mut progress)?);
        progress.finish_run();
    }
    print_and_write(&args.experiment, "simulate", &done)
}

fn plot_delays(args: &PlotDelaysArgs) -> Result<(), BoxError> {
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join("delays.svg");
    std::fs::write(&path, delays_svg(args.retries, args.seed))?;
    println!("wrote {}", path.display());
    Ok(())
}
