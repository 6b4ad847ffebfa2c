//! `demo-client`: the demo load generator and the pause-and-resume outage experiment.
//!
//! See `demo-client --help` and the crate's README.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::Parser;
use demo_client::cli::{
    BenchArgs, Cli, Command, EnvoyArgs, FleetArgs, PlotDelaysArgs, RunArgs, ScenarioArgs,
    SimulateArgs,
};
use demo_client::drive::Progress;
use demo_client::load::{spawn_clients, status_line};
use demo_client::output::{RunRecord, delays_svg};
use demo_client::process::{Pausable, find_server};
use demo_client::record::{Recorder, Second};
use demo_client::report::{Table, percentile};
use demo_client::scenario::{RealRun, Target, real_run, write_outputs};
use demo_client::simulate::{SimulatedRun, simulate_run};
use demo_client::stack::network_stack;
use overload_core::clock::{SystemWallClock, WallClock};
use tower::BoxError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => runtime().and_then(|rt| rt.block_on(run(args))),
        Command::Scenario(args) => runtime().and_then(|rt| rt.block_on(scenario(args))),
        Command::Simulate(args) => simulate(&args),
        Command::Fleet(args) => runtime().and_then(|rt| rt.block_on(fleet(args))),
        Command::PlotDelays(args) => plot_delays(&args),
        Command::Envoy(args) => runtime().and_then(|rt| rt.block_on(envoy(args))),
        Command::Bench(args) => runtime().and_then(|rt| rt.block_on(bench(args))),
        Command::Spike(args) => runtime().and_then(|rt| rt.block_on(args.run())),
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
    let every = args.report_every()?;
    let recorder = Recorder::new();
    let stack = network_stack(
        args.strategy,
        load.clients(),
        timeout,
        args.load.max_body,
        load.seed(),
        &(Arc::new(SystemWallClock) as Arc<dyn WallClock>),
        &recorder,
    )?;
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
    let step = Duration::from_secs(every);
    let report = async {
        let mut next = start + step;
        let mut hinted = false;
        loop {
            if deadline.is_some_and(|d| d < next) {
                tokio::time::sleep_until(deadline.unwrap_or(next)).await;
                return;
            }
            tokio::time::sleep_until(next).await;
            let to = usize::try_from((next - start).as_secs()).unwrap_or(usize::MAX);
            let every = usize::try_from(every).unwrap_or(usize::MAX);
            let totals = recorder.totals(to.saturating_sub(every), to);
            println!(
                "{} +{to}s  {}",
                utc_time_of_day(SystemTime::now()),
                status_line(&totals, every)
            );
            if totals.refused > 0 && totals.ok == 0 {
                if !hinted {
                    eprintln!("{}", refused_hint(load.url()));
                    hinted = true;
                }
            } else if totals.ok > 0 {
                hinted = false;
            }
            next += step;
        }
    };
    tokio::select! {
        () = report => {}
        () = shutdown_signal() => eprintln!("stopping"),
    }
    let stopped = tokio::time::Instant::now();
    let unfinished = clients.stop(stopped).await;
    let total = recorder.totals(0, usize::MAX);
    print_summary(&total, &unfinished, stopped - start);
    Ok(())
}

/// What to say when nothing answers at `url`.
fn refused_hint(url: &http::Uri) -> String {
    format!(
        "hint: nothing answers at {url} (connection refused). Is a server running there? \
         Start one with `target/release/demo-server` (or `cargo run --release -p demo-server`), \
         or point --url at yours."
    )
}

/// The time of day of `now` in UTC, `HH:MM:SSZ`.
fn utc_time_of_day(now: SystemTime) -> String {
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        % 86_400;
    format!("{:02}:{:02}:{:02}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

fn print_summary(total: &Second, unfinished: &[Duration], elapsed: Duration) {
    let mut latencies = total.latencies.clone();
    latencies.sort_unstable();
    let mut outcomes = latencies.clone();
    outcomes.extend_from_slice(&total.failure_latencies);
    outcomes.extend_from_slice(unfinished);
    outcomes.sort_unstable();
    let ms = |values: &[Duration], q| {
        percentile(values, q).map_or_else(|| "-".to_owned(), |d| format!("{} ms", d.as_millis()))
    };
    println!(
        "summary after {:.1} s: {} requests, {} OK, {} failed ({} refused locally by the client-side throttle), {} still waiting; {} attempts ({} retries), {} rejected (429/503), {} timed out, {} budget refusals, {} stop signals; OK p50 {}, p99 {}; every outcome p99 {}",
        elapsed.as_secs_f64(),
        total.requests,
        total.ok,
        total.failed,
        total.throttled,
        unfinished.len(),
        total.attempts,
        total.retries,
        total.rejected,
        total.timeouts,
        total.budget_refusals,
        total.stop_signals,
        ms(&latencies, 0.5),
        ms(&latencies, 0.99),
        ms(&outcomes, 0.99),
    );
}

fn print_and_write(out: &Path, name: &str, runs: &[RunRecord]) -> Result<(), BoxError> {
    let reports: Vec<_> = runs.iter().map(|r| r.report.clone()).collect();
    println!("{}", Table(&reports));
    let paths = write_outputs(out, name, runs)?;
    for p in paths {
        println!("wrote {}", p.display());
    }
    std::io::stdout().flush()?;
    Ok(())
}

/// `1 run`, `4 runs`.
fn runs(n: usize) -> String {
    if n == 1 {
        "1 run".to_owned()
    } else {
        format!("{n} runs")
    }
}

async fn scenario(args: ScenarioArgs) -> Result<(), BoxError> {
    let experiment = &args.experiment;
    // NOTE: every flag is checked before any server starts or any file is written.
    let target = match (&args.url, args.pause_pid) {
        (Some(url), Some(pid)) => Target::External {
            url: url.clone(),
            pid: Pausable::from_pid(pid).ok_or("--pause-pid must be a positive process id")?,
        },
        _ => {
            let program = find_server(args.server_bin.as_deref()).ok_or(
                "cannot find the demo-server executable next to this one: build both with \
                 `cargo build --release -p demo-server -p demo-client` or pass --server-bin",
            )?;
            // NOTE: the user's --server-arg values come last: demo-server lets a later flag
            // override an earlier one.
            let mut server_args: Vec<OsString> = vec![
                "--abandoned".into(),
                experiment.abandoned.name().into(),
                "--backlog".into(),
                experiment.backlog.to_string().into(),
            ];
            server_args.extend(args.server_args.iter().map(OsString::from));
            Target::Spawn {
                program,
                args: server_args,
            }
        }
    };
    let url = match &target {
        Target::External { url, .. } => url.clone(),
        Target::Spawn { .. } => demo_client::load::DEFAULT_URL.parse()?,
    };
    let (timing, load) = experiment.validate(url)?;
    let timeout = experiment.load.attempt_timeout()?;
    let out = experiment.out_dir();
    std::fs::create_dir_all(&out)?;
    let run = RealRun {
        timing,
        clients: experiment.load.clients,
        think_time: load.think_time(),
        timeout,
        max_body: experiment.load.max_body,
        seed: load.seed(),
        target: &target,
        log_dir: Some(&out),
    };
    let total = timing.total() * u32::try_from(experiment.runs.len()).unwrap_or(u32::MAX);
    eprintln!(
        "{} of {} s each ({} s steady, {} s paused, {} s observed): about {} s",
        runs(experiment.runs.len()),
        timing.total().as_secs(),
        timing.steady().as_secs(),
        timing.pause().as_secs(),
        timing.observe().as_secs(),
        total.as_secs()
    );
    let mut progress = Progress::new(true);
    let mut done = Vec::new();
    let all = async {
        for (i, spec) in experiment.runs.iter().enumerate() {
            progress.start_run(i + 1, experiment.runs.len(), &spec.label());
            done.push(real_run(*spec, &run, &mut progress).await?);
        }
        Ok::<(), BoxError>(())
    };
    let outcome = tokio::select! {
        r = all => r,
        () = shutdown_signal() => Err("interrupted: the demo-server children were killed".into()),
    };
    if !done.is_empty() {
        print_and_write(&out, "scenario", &done)?;
    }
    outcome
}

/// Envoy's counters `demo-client envoy` prints when it stops: the requests its clients
/// sent, and what it sent the servers, retried, and answered on its own.
fn envoy_counter_printed(name: &str) -> bool {
    name.starts_with("http.ingress.downstream_rq_")
        || name.starts_with("cluster.upstream.upstream_rq_")
        || name.starts_with("cluster.upstream.upstream_cx_connect_fail")
        || name.starts_with("cluster.upstream.retry_or_shadow_abandoned")
}

async fn envoy(args: EnvoyArgs) -> Result<(), BoxError> {
    use demo_client::envoy::{EnvoyProxy, find_envoy};
    // NOTE: every setting is checked, and Envoy found, before anything starts.
    let settings = args.settings()?;
    let program = find_envoy(args.envoy.as_deref())?;
    let proxy = EnvoyProxy::start(&program, &args.dir, &settings, &args.upstreams).await?;
    println!(
        "envoy listening on http://{} (admin http://{})",
        proxy.addr(),
        proxy.admin_addr()
    );
    std::io::stdout().flush()?;
    eprintln!(
        "configuration and log in {}; Ctrl-C stops",
        args.dir.display()
    );
    shutdown_signal().await;
    let stats = proxy.stats().await;
    proxy.shutdown().await?;
    for (name, value) in stats?.all() {
        if envoy_counter_printed(name) {
            println!("{name}: {value}");
        }
    }
    Ok(())
}

async fn bench(args: BenchArgs) -> Result<(), BoxError> {
    use demo_client::bench::runner::{BenchConfig, run_curve};
    use demo_client::bench::system::{Programs, System};
    use demo_client::bench::table::{CSV_HEADER, csv_line, progress_line};
    use demo_client::envoy::find_envoy;
    // NOTE: every setting is checked, and every executable found, before anything starts.
    let plan = args.plan()?;
    let step = args.step.then(|| args.step_plan()).transpose()?;
    let server = find_server(args.server_bin.as_deref()).ok_or(
        "no demo-server next to demo-client; build it (cargo build --release -p demo-server) \
         or give --server-bin",
    )?;
    let envoy = if plan.systems.contains(&System::Envoy) {
        Some(find_envoy(args.envoy.as_deref())?)
    } else {
        None
    };
    std::fs::create_dir_all(&args.out)?;
    let (max_in_flight, lowered) =
        demo_client::bench::limits::fit_in_flight(args.max_in_flight.get());
    if let Some(message) = lowered {
        eprintln!("{message}");
    }
    if args.quick {
        eprintln!("--quick: warm-ups too short to settle; the figures are not steady state");
    }
    let config = BenchConfig {
        programs: Programs { server, envoy },
        dir: args.out.join("envoy"),
        warmup: plan.warmup,
        duration: plan.duration,
        timeout: args.timeout,
        max_in_flight,
        arrivals: args.arrivals(),
    };
    if let Some(step) = step {
        return bench_step(&args, &config, &plan.systems, &plan.models, &step).await;
    }
    let names = |v: Vec<String>| v.join(",");
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    println!(
        "# demo-client bench\n\nsystems {}; models {}; loads {}; {} round(s); warm-up until settled, at most {:?}, recorded {:?} a point; \
         timeout {:?}; in-flight cap {}; arrivals {:?}; {cores} cores, load average {}\n",
        names(plan.systems.iter().map(ToString::to_string).collect()),
        names(plan.models.iter().map(ToString::to_string).collect()),
        names(plan.loads.iter().map(ToString::to_string).collect()),
        plan.rounds,
        plan.warmup,
        plan.duration,
        args.timeout,
        config.max_in_flight,
        config.arrivals,
        load_average(),
    );
    // NOTE: each point is appended as it is measured, so a run that fails keeps them; the
    // file is rewritten sorted at the end.
    let csv = args.out.join("bench.csv");
    std::fs::write(&csv, CSV_HEADER)?;
    let mut partial = std::fs::OpenOptions::new().append(true).open(&csv)?;
    // NOTE: on Ctrl-C or SIGTERM the curve is dropped, and with it the point's `Running`,
    // whose children are SIGKILLed: no server is left holding its port (review S8).
    let curve = run_curve(
        &config,
        &plan.models,
        &plan.loads,
        &plan.systems,
        plan.rounds,
        !args.no_calibration,
        |spec, figures| {
            eprintln!("{}", progress_line(spec, figures));
            if let Err(e) = partial.write_all(csv_line(spec, figures).as_bytes()) {
                eprintln!("cannot append to {}: {e}", csv.display());
            }
        },
    );
    let results = tokio::select! {
        results = curve => results?,
        () = shutdown_signal() => {
            return Err(format!(
                "interrupted; the points measured so far are in {}",
                csv.display()
            )
            .into());
        }
    };
    // NOTE: with one round the medians are the points as measured.
    let (medians, spreads) = results.medians();
    if plan.rounds > 1 {
        println!(
            "Medians of {} rounds, each figure on its own:\n",
            plan.rounds
        );
    }
    println!("{}", medians.markdown());
    if plan.rounds > 1 {
        println!(
            "How far the rounds spread:\n\n{}",
            demo_client::bench::medians::spread_markdown(&spreads)
        );
    }
    for &model in &plan.models {
        for line in medians.criteria(model) {
            println!("- {line}");
        }
    }
    println!("load average at the end {}", load_average());
    std::fs::write(&csv, results.csv())?;
    eprintln!("wrote {} (every round's point)", csv.display());
    if plan.rounds > 1 {
        let path = args.out.join("bench-medians.csv");
        std::fs::write(&path, medians.csv())?;
        eprintln!("wrote {}", path.display());
    }
    for &model in &plan.models {
        if let Some(svg) = medians.svg(model) {
            let path = args.out.join(format!("bench-{model}.svg"));
            std::fs::write(&path, svg)?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// `demo-client bench --step`: per model, each system started fresh for its own step run,
/// in an order rotated by one from a model to the next.
async fn bench_step(
    args: &BenchArgs,
    config: &demo_client::bench::runner::BenchConfig,
    systems: &[demo_client::bench::system::System],
    models: &[demo_client::bench::system::Model],
    plan: &demo_client::bench::step::StepPlan,
) -> Result<(), BoxError> {
    use demo_client::bench::step::{BAND, run_step};
    use demo_client::bench::step_table;
    let names = |v: Vec<String>| v.join(",");
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    println!(
        "# demo-client bench --step\n\nsystems {}; models {}; 0.8x, 3x, 0.8x for {:?} each; window {:?}, \
         steady part {:?}, band {:.0} %; timeout {:?}; in-flight cap {}; arrivals {:?}; {cores} cores, \
         load average {}\n",
        names(systems.iter().map(ToString::to_string).collect()),
        names(models.iter().map(ToString::to_string).collect()),
        plan.phase(),
        plan.window(),
        plan.steady(),
        100.0 * BAND,
        config.timeout,
        config.max_in_flight,
        config.arrivals,
        load_average(),
    );
    let mut runs = Vec::new();
    for (round, &model) in models.iter().enumerate() {
        for k in 0..systems.len() {
            let system = systems[(round + k) % systems.len()];
            let run = run_step(config, plan, system, model).await?;
            let [start, up, down] = run.phases;
            let time = |t: Option<Duration>| {
                t.map_or_else(
                    || "never".to_owned(),
                    |t| format!("{:.1} s", t.as_secs_f64()),
                )
            };
            eprintln!(
                "{model} {system}: steady {:.0} / {:.0} / {:.0} req/s; converged {} / {} / {}",
                start.steady,
                up.steady,
                down.steady,
                time(start.converged),
                time(up.converged),
                time(down.converged),
            );
            runs.push(run);
        }
    }
    println!("{}", step_table::markdown(&runs, plan));
    println!("load average at the end {}", load_average());
    for (name, text) in [
        ("step.csv", step_table::timeline_csv(&runs, plan)),
        ("step-summary.csv", step_table::summary_csv(&runs)),
    ] {
        let path = args.out.join(name);
        std::fs::write(&path, text)?;
        eprintln!("wrote {}", path.display());
    }
    for &model in models {
        if let Some(svg) = step_table::svg(&runs, plan, model) {
            let path = args.out.join(format!("step-{model}.svg"));
            std::fs::write(&path, svg)?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// The first three fields of /proc/loadavg, or `unknown`.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".to_owned(),
        |text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        },
    )
}

async fn fleet(args: FleetArgs) -> Result<(), BoxError> {
    use demo_client::envoy::{ProxySettings, find_envoy};
    use demo_client::fleet::{
        BalancerSettings, FleetBalancer, FleetRun, SurvivorTable, find_haproxy, fleet_run,
        write_fleet_outputs,
    };
    // NOTE: every flag is checked, and both executables found, before anything starts.
    let (timing, load) = args.validate(demo_client::load::DEFAULT_URL.parse()?)?;
    let server = find_server(args.server_bin.as_deref()).ok_or(
        "cannot find the demo-server executable next to this one: build both with \
         `cargo build --release -p demo-server -p demo-client` or pass --server-bin",
    )?;
    let program = match args.envoy_retry() {
        None => find_haproxy(args.haproxy.as_deref())?,
        Some(_) => find_envoy(args.envoy.as_deref())?,
    };
    let mut server_args: Vec<OsString> = ["--model", "mmc", "--trusted-proxy", "127.0.0.1"]
        .map(OsString::from)
        .to_vec();
    server_args.extend(args.server_args.iter().map(OsString::from));
    let haproxy = BalancerSettings {
        check_interval: args.check_interval.0,
        retries: args.balancer_retries,
        retry_on: args.balancer_retry_on.clone(),
        redispatch: args.redispatch,
    };
    // NOTE: two workers, as Istio's sidecar runs by default (`concurrency: 2`); Envoy's
    // other defaults are the launcher's: the attempt count on, a 15 s route timeout (longer
    // than any client waits), circuit breakers as wide open as Istio's.
    let envoy = ProxySettings {
        retry: args.envoy_retry().flatten(),
        health_check: args.check_interval.0,
        workers: 2,
        ..ProxySettings::default()
    };
    let balancer = match args.envoy_retry() {
        None => FleetBalancer::HaProxy {
            program: &program,
            settings: &haproxy,
        },
        Some(_) => FleetBalancer::Envoy {
            program: &program,
            settings: &envoy,
        },
    };
    let out = args.out_dir();
    std::fs::create_dir_all(&out)?;
    let run = FleetRun {
        timing,
        clients: args.clients,
        think_time: load.think_time(),
        timeout: args.timeout,
        max_body: args.max_body,
        seed: load.seed(),
        server: &server,
        server_args: &server_args,
        balancer,
        capacity: args.capacity,
        dir: &out,
    };
    let total = timing.total() * u32::try_from(args.runs.len()).unwrap_or(u32::MAX);
    eprintln!(
        "3 servers behind {}, {} clients offering about {:.0} req/s ({:.0} % of 3 x {:.0} req/s); \
         {} of {} s each ({} s steady, {} s with one server stopped, {} s observed): about {} s",
        balancer.name(),
        args.clients,
        load.offered_rate(),
        100.0 * load.offered_rate() / (3.0 * args.capacity),
        args.capacity,
        runs(args.runs.len()),
        timing.total().as_secs(),
        timing.steady().as_secs(),
        timing.pause().as_secs(),
        timing.observe().as_secs(),
        total.as_secs()
    );
    let mut progress = Progress::new(true);
    let mut done = Vec::new();
    let all = async {
        for (i, spec) in args.runs.iter().enumerate() {
            progress.start_run(i + 1, args.runs.len(), &spec.label());
            done.push(fleet_run(*spec, &run, &mut progress).await?);
        }
        Ok::<(), BoxError>(())
    };
    let outcome = tokio::select! {
        r = all => r,
        () = shutdown_signal() => Err("interrupted: the servers and the balancer were stopped".into()),
    };
    if !done.is_empty() {
        let reports: Vec<_> = done.iter().map(|r| r.run.report.clone()).collect();
        println!("{}", Table(&reports));
        println!("{}", SurvivorTable(&done));
        for p in write_fleet_outputs(&out, &done)? {
            println!("wrote {}", p.display());
        }
        std::io::stdout().flush()?;
    }
    outcome
}

fn simulate(args: &SimulateArgs) -> Result<(), BoxError> {
    let experiment = &args.experiment;
    let (timing, load) = experiment.validate(demo_client::load::DEFAULT_URL.parse()?)?;
    let timeout = experiment.load.attempt_timeout()?;
    let mut progress = Progress::new(true);
    let mut done = Vec::new();
    for (i, spec) in experiment.runs.iter().enumerate() {
        progress.start_run(i + 1, experiment.runs.len(), &spec.label());
        let run = SimulatedRun {
            timing,
            load: load.clone(),
            timeout,
            max_body: experiment.load.max_body,
            abandoned: experiment.abandoned.into(),
            backlog: usize::try_from(experiment.backlog).unwrap_or(usize::MAX),
        };
        done.push(simulate_run(*spec, &run, &mut progress)?);
        progress.finish_run();
    }
    print_and_write(&experiment.out_dir(), "simulate", &done)
}

fn plot_delays(args: &PlotDelaysArgs) -> Result<(), BoxError> {
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join("delays.svg");
    std::fs::write(&path, delays_svg(args.retries, args.seed))?;
    println!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_counted_in_english() {
        assert_eq!(runs(1), "1 run");
        assert_eq!(runs(4), "4 runs");
    }

    #[test]
    fn timestamps_are_utc_times_of_day() {
        let t =
            SystemTime::UNIX_EPOCH + Duration::from_secs(19_000 * 86_400 + 13 * 3600 + 5 * 60 + 9);
        assert_eq!(utc_time_of_day(t), "13:05:09Z");
    }

    #[test]
    fn the_refused_hint_says_what_to_start() {
        let hint = refused_hint(&"http://127.0.0.1:8070/api".parse().unwrap());
        assert!(hint.contains("http://127.0.0.1:8070/api"), "{hint}");
        assert!(hint.contains("demo-server"), "{hint}");
    }
}
