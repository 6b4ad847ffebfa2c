use super::*;
use crate::bench::open_loop::Arrivals;
use crate::bench::step::StepPlan;
use crate::bench::system::{Model, System};
use crate::client::CollectLayer;

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
    assert_eq!(run.report_every(), Ok(1));
    assert_eq!(run.load.max_body, CollectLayer::DEFAULT_MAX_BODY);
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
    assert!(
        err.contains(
            "expected fixed, exponential, exponential-program, full, full-no-throttle, \
             full-reqwest or reqwest-default"
        ),
        "{err}"
    );
    let err = parse(&["run", "--clients", "0"]).unwrap_err().to_string();
    assert!(err.contains("--clients"), "{err}");
    let err = parse(&["run", "--max-body", "1MB"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("invalid size"), "{err}");
    let Command::Run(run) = parse(&["run", "--report-every", "1500ms"]).unwrap().command else {
        panic!("not run");
    };
    assert!(run.report_every().is_err());
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
    assert_eq!(s.experiment.out_dir(), PathBuf::from("target/scenario"));
    // The article's server: abandoned work served, Go's listen queue.
    assert_eq!(Abandoned::from(s.experiment.abandoned), Abandoned::Serve);
    assert_eq!(s.experiment.backlog, 4096);
    let Command::Simulate(q) = parse(&["simulate", "--quick"]).unwrap().command else {
        panic!("not simulate");
    };
    let q = q.experiment;
    assert_eq!(Abandoned::from(q.abandoned), Abandoned::Serve);
    assert_eq!(q.timing(), Ok(Timing::QUICK));
    // A quick run never overwrites a full run's files...
    assert_eq!(q.out_dir(), PathBuf::from("target/scenario/quick"));
    // ...unless told to.
    let Command::Scenario(s) = parse(&["scenario", "--quick", "--out", "x"])
        .unwrap()
        .command
    else {
        panic!("not scenario");
    };
    assert_eq!(s.experiment.out_dir(), PathBuf::from("x"));
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
fn every_experiment_setting_is_checked_before_anything_starts() {
    let url = Uri::from_static("http://127.0.0.1:8070/api");
    for (args, needle) in [
        (
            &["scenario", "--quick", "--think-time", "0s"][..],
            "think time",
        ),
        (&["scenario", "--timeout", "0s"], "timeout"),
        (&["scenario", "--pause", "1500ms"], "whole number"),
        (&["simulate", "--observe", "5s"], "observation"),
    ] {
        let experiment = match parse(args).unwrap().command {
            Command::Scenario(s) => s.experiment,
            Command::Simulate(s) => s.experiment,
            _ => unreachable!(),
        };
        let err = experiment.validate(url.clone()).unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn fleet_defaults_and_quick() {
    let Command::Fleet(f) = parse(&["fleet"]).unwrap().command else {
        panic!("not fleet");
    };
    let (timing, load) = f
        .validate(Uri::from_static("http://127.0.0.1:1/api"))
        .unwrap();
    assert_eq!(timing.phases().pause_for, 20);
    assert!((load.offered_rate() - 454.5).abs() < 0.1);
    assert_eq!(f.check_interval, Check(Some(Duration::from_millis(500))));
    assert_eq!(f.out_dir(), PathBuf::from("target/fleet"));
    assert_eq!(f.runs.len(), 4);
    let Command::Fleet(q) = parse(&["fleet", "--quick", "--check-interval", "off"])
        .unwrap()
        .command
    else {
        panic!("not fleet");
    };
    assert_eq!(q.timing(), Ok(FLEET_QUICK));
    assert_eq!(FLEET_QUICK.total(), Duration::from_secs(32));
    assert_eq!(q.check_interval, Check(None));
    assert_eq!(q.out_dir(), PathBuf::from("target/fleet/quick"));
    assert!(parse(&["fleet", "--check-interval", "1ms"]).is_err());
    assert!(parse(&["fleet", "--quick", "--outage", "5s"]).is_err());
    let Command::Fleet(bad) = parse(&["fleet", "--balancer-retry-on", "x\nbackend y"])
        .unwrap()
        .command
    else {
        panic!("not fleet");
    };
    let url = Uri::from_static("http://127.0.0.1:1/api");
    assert!(bad.validate(url.clone()).is_err());
    let Command::Fleet(bad) = parse(&["fleet", "--capacity", "0"]).unwrap().command else {
        panic!("not fleet");
    };
    assert!(bad.validate(url).is_err());
}

/// Issue 32: the fleet behind Envoy, with a mesh's retry policy.
#[test]
fn fleet_behind_envoy() {
    let url = Uri::from_static("http://127.0.0.1:1/api");
    let Command::Fleet(h) = parse(&["fleet"]).unwrap().command else {
        panic!("not fleet");
    };
    assert_eq!(h.balancer, BalancerArg::Haproxy);
    assert_eq!(h.envoy_retry(), None);
    let Command::Fleet(e) = parse(&["fleet", "--balancer", "envoy"]).unwrap().command else {
        panic!("not fleet");
    };
    assert!(e.validate(url.clone()).is_ok());
    assert_eq!(e.balancer, BalancerArg::Envoy);
    assert_eq!(e.envoy_retry(), Some(Some(RetryPolicy::istio_default())));
    assert_eq!(e.out_dir(), PathBuf::from("target/fleet-envoy"));
    for (flag, policy) in [
        ("istio", Some(RetryPolicy::istio_default())),
        ("rate-limits", Some(RetryPolicy::with_rate_limits())),
        ("off", None),
    ] {
        let Command::Fleet(e) = parse(&["fleet", "--balancer", "envoy", "--envoy-retry", flag])
            .unwrap()
            .command
        else {
            panic!("not fleet");
        };
        assert_eq!(e.envoy_retry(), Some(policy), "{flag}");
    }
    let Command::Fleet(q) = parse(&["fleet", "--balancer", "envoy", "--quick"])
        .unwrap()
        .command
    else {
        panic!("not fleet");
    };
    assert_eq!(q.out_dir(), PathBuf::from("target/fleet-envoy/quick"));
    // Another balancer's settings are an error, not silently ignored.
    for (args, needle) in [
        (
            &["fleet", "--balancer", "envoy", "--redispatch"][..],
            "HAProxy",
        ),
        (
            &["fleet", "--balancer", "envoy", "--balancer-retries", "1"],
            "HAProxy",
        ),
        (
            &["fleet", "--balancer", "envoy", "--balancer-retry-on", "503"],
            "HAProxy",
        ),
        (
            &["fleet", "--balancer", "envoy", "--haproxy", "/x"],
            "--haproxy",
        ),
        (&["fleet", "--envoy-retry", "off"], "--balancer envoy"),
        (&["fleet", "--envoy", "/x"], "--balancer envoy"),
    ] {
        let Command::Fleet(bad) = parse(args).unwrap().command else {
            panic!("not fleet");
        };
        let err = bad.validate(url.clone()).unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert!(parse(&["fleet", "--balancer", "nginx"]).is_err());
    assert!(parse(&["fleet", "--balancer", "envoy", "--envoy-retry", "always"]).is_err());
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

#[test]
fn envoy_defaults_and_settings() {
    let Command::Envoy(e) = parse(&["envoy", "--upstream", "127.0.0.1:8070"])
        .unwrap()
        .command
    else {
        panic!("not envoy");
    };
    assert_eq!(e.upstreams, ["127.0.0.1:8070".parse().unwrap()]);
    assert_eq!(e.retry, EnvoyRetry::Istio);
    assert_eq!(e.dir, PathBuf::from("target/envoy"));
    let settings = e.settings().unwrap();
    assert_eq!(settings.retry, Some(RetryPolicy::istio_default()));
    assert!(settings.include_attempt_count);
    assert_eq!(settings.route_timeout, Duration::from_secs(15));
    assert_eq!(settings.health_check, None);
    assert!(!settings.upstream_http2);
    assert_eq!(settings.workers, 1);
    assert!(!settings.deadline_header);
    assert!(!settings.adaptive_concurrency);

    let Command::Envoy(e) = parse(&[
        "envoy",
        "--upstream",
        "127.0.0.1:1",
        "--upstream",
        "127.0.0.1:2",
        "--retry",
        "rate-limits",
        "--route-timeout",
        "1500ms",
        "--no-attempt-count",
        "--health-check",
        "500ms",
        "--http2",
        "--workers",
        "2",
        "--deadline-header",
        "--adaptive-concurrency",
    ])
    .unwrap()
    .command
    else {
        panic!("not envoy");
    };
    assert_eq!(e.upstreams.len(), 2);
    let settings = e.settings().unwrap();
    assert_eq!(settings.retry, Some(RetryPolicy::with_rate_limits()));
    assert!(!settings.include_attempt_count);
    assert_eq!(settings.route_timeout, Duration::from_millis(1500));
    assert_eq!(settings.health_check, Some(Duration::from_millis(500)));
    assert!(settings.upstream_http2);
    assert_eq!(settings.workers, 2);
    assert!(settings.deadline_header);
    assert!(settings.adaptive_concurrency);
    let Command::Envoy(e) = parse(&["envoy", "--upstream", "127.0.0.1:1", "--retry", "none"])
        .unwrap()
        .command
    else {
        panic!("not envoy");
    };
    assert_eq!(e.settings().unwrap().retry, None);
}

#[test]
fn envoy_refuses_bad_settings() {
    // No server, a host name, no worker.
    assert!(parse(&["envoy"]).is_err());
    assert!(parse(&["envoy", "--upstream", "localhost:8070"]).is_err());
    assert!(parse(&["envoy", "--upstream", "127.0.0.1:1", "--workers", "0"]).is_err());
    for (flag, value, message) in [
        (
            "--route-timeout",
            "0s",
            "--route-timeout must be at least 1ms",
        ),
        (
            "--health-check",
            "1ms",
            "--health-check must be at least 10ms",
        ),
    ] {
        let Command::Envoy(e) = parse(&["envoy", "--upstream", "127.0.0.1:1", flag, value])
            .unwrap()
            .command
        else {
            panic!("not envoy");
        };
        assert_eq!(e.settings().unwrap_err(), message);
    }
}

#[test]
fn bench_defaults_are_the_whole_curve_and_quick_is_short() {
    let Command::Bench(b) = parse(&["bench"]).unwrap().command else {
        panic!("not bench");
    };
    let plan = b.plan().unwrap();
    assert_eq!(plan.systems, System::ALL.to_vec());
    assert_eq!(plan.models, vec![Model::Mmc, Model::Article]);
    assert_eq!(plan.loads, vec![1.0, 1.5, 3.0, 10.0, 100.0]);
    assert_eq!(
        (plan.warmup, plan.duration),
        (Duration::from_secs(60), Duration::from_secs(6))
    );
    assert_eq!(b.timeout, Duration::from_secs(2));
    assert_eq!(b.max_in_flight.get(), 4096);
    assert_eq!(b.arrivals(), Arrivals::Fixed);
    assert!(!b.no_calibration);
    assert_eq!(b.out, PathBuf::from("target/bench"));
    assert_eq!(plan.rounds, 1);

    let Command::Bench(q) = parse(&["bench", "--quick"]).unwrap().command else {
        panic!("not bench");
    };
    let quick = q.plan().unwrap();
    assert_eq!(quick.loads, vec![1.0, 3.0, 10.0]);
    assert_eq!(
        (quick.warmup, quick.duration),
        (Duration::from_secs(5), Duration::from_secs(2))
    );
}

#[test]
fn bench_rounds_are_counted_from_one_and_not_with_step() {
    let Command::Bench(b) = parse(&["bench", "--rounds", "3"]).unwrap().command else {
        panic!("not bench");
    };
    assert_eq!(b.plan().unwrap().rounds, 3);
    assert!(
        parse(&["bench", "--rounds", "0"]).is_err(),
        "no zero rounds"
    );
    assert!(
        parse(&["bench", "--step", "--rounds", "3"]).is_err(),
        "--step has its own plan"
    );
}

#[test]
fn bench_selections_win_over_quick_and_bad_ones_are_refused() {
    let Command::Bench(b) = parse(&[
        "bench",
        "--quick",
        "--systems",
        "adaptive,envoy",
        "--models",
        "mmc",
        "--loads",
        "3,10",
        "--duration",
        "4s",
        "--poisson",
        "--seed",
        "9",
    ])
    .unwrap()
    .command
    else {
        panic!("not bench");
    };
    let plan = b.plan().unwrap();
    assert_eq!(plan.systems, vec![System::Adaptive, System::Envoy]);
    assert_eq!(plan.models, vec![Model::Mmc]);
    assert_eq!(plan.loads, vec![3.0, 10.0]);
    assert_eq!(
        (plan.warmup, plan.duration),
        (Duration::from_secs(5), Duration::from_secs(4))
    );
    assert_eq!(b.arrivals(), Arrivals::Poisson { seed: 9 });

    let e = parse(&["bench", "--systems", "istio"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown system `istio`"), "{e}");
    let Command::Bench(b) = parse(&["bench", "--loads", "3,0"]).unwrap().command else {
        panic!("not bench");
    };
    assert_eq!(
        b.plan().unwrap_err(),
        "--loads: a load must be a finite number above zero, got 0"
    );
    let Command::Bench(b) = parse(&["bench", "--duration", "0s"]).unwrap().command else {
        panic!("not bench");
    };
    assert_eq!(b.plan().unwrap_err(), "--duration must be above zero");
    // Review S9 and N2: a load that would keep the generator busy for hours, a zero timeout.
    let Command::Bench(b) = parse(&["bench", "--loads", "3,1e9"]).unwrap().command else {
        panic!("not bench");
    };
    assert_eq!(
        b.plan().unwrap_err(),
        "--loads: a load must be at most 1000 (x the capacity), got 1000000000"
    );
    let Command::Bench(b) = parse(&["bench", "--timeout", "0s"]).unwrap().command else {
        panic!("not bench");
    };
    assert_eq!(b.plan().unwrap_err(), "--timeout must be above zero");
}

#[test]
fn bench_step_takes_its_phases_and_refuses_the_curves_settings() {
    let Command::Bench(b) = parse(&["bench", "--step"]).unwrap().command else {
        panic!("not bench");
    };
    assert!(b.step);
    assert_eq!(b.step_plan(), Ok(StepPlan::default()));
    let default = StepPlan::default();
    assert_eq!(
        (default.phase(), default.window(), default.steady()),
        (
            Duration::from_secs(8),
            Duration::from_secs(1),
            Duration::from_secs(3)
        )
    );
    let Command::Bench(b) = parse(&[
        "bench",
        "--step",
        "--systems",
        "adaptive,little",
        "--phase",
        "4s",
        "--window",
        "500ms",
        "--steady",
        "2s",
    ])
    .unwrap()
    .command
    else {
        panic!("not bench");
    };
    let plan = b.step_plan().unwrap();
    assert_eq!(
        (plan.phase(), plan.window(), plan.steady()),
        (
            Duration::from_secs(4),
            Duration::from_millis(500),
            Duration::from_secs(2)
        )
    );
    assert_eq!(
        b.plan().unwrap().systems,
        vec![System::Adaptive, System::Little]
    );

    // The curve's settings mean nothing to a step run, and the step's nothing to the curve.
    for bad in [
        &["bench", "--step", "--loads", "3"][..],
        &["bench", "--step", "--quick"],
        &["bench", "--step", "--duration", "4s"],
        &["bench", "--step", "--no-calibration"],
        &["bench", "--phase", "4s"],
        &["bench", "--window", "1s"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?} was accepted");
    }
    let Command::Bench(b) = parse(&["bench", "--step", "--window", "150ms"])
        .unwrap()
        .command
    else {
        panic!("not bench");
    };
    assert_eq!(
        b.step_plan().unwrap_err(),
        "--window must be a multiple of 100 ms, got 150 ms"
    );
}
