use clap::CommandFactory;

use super::*;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("demo-server").chain(args.iter().copied()))
}

#[test]
fn the_command_line_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn defaults_are_the_articles_server_behind_the_full_stack() {
    let cli = parse(&[]).unwrap();
    assert_eq!(cli.listen, "127.0.0.1:8070".parse().unwrap());
    assert_eq!(cli.stack, StackArg::Full);
    let plan = cli.plan().unwrap();
    assert_eq!(plan.latency, LatencyModel::Article(ArticleModel::default()));
    assert!(matches!(plan.stack, Stack::Full { .. }));
    let rl = cli.rate_limit_config();
    assert_eq!((rl.rate, rl.burst), (250, Some(5)));
    assert_eq!(rl.algorithm, Algorithm::TokenBucket);
    // The article's server: abandoned work served, Go's listen queue.
    assert_eq!(plan.backlog, 4096);
    assert_eq!(plan.server, ServerConfig::new());
    assert_eq!(plan.server.abandoned(), Abandoned::Serve);
    // Under hostile peers: headers within 10 s, 10 000 connections, 1 MiB bodies.
    assert_eq!(plan.server.header_read_timeout(), Duration::from_secs(10));
    assert_eq!(plan.server.max_connections().get(), 10_000);
    assert_eq!(cli.max_downstream_body, 1 << 20);
    // The deadline layer's defaults.
    assert_eq!(
        plan.deadline.skew_allowance(),
        DeadlineLayer::DEFAULT_SKEW_ALLOWANCE
    );
    assert!(plan.deadline.cancel_at_deadline());
}

#[test]
fn stack_deadline_is_the_deadline_layer_alone_with_its_skew_allowance() {
    let plan = parse(&["--stack", "deadline", "--skew-allowance", "50ms"])
        .unwrap()
        .plan()
        .unwrap();
    assert!(matches!(plan.stack, Stack::Deadline));
    assert_eq!(plan.stack.name(), "deadline");
    assert_eq!(plan.deadline.skew_allowance(), Duration::from_millis(50));
}

#[test]
fn limits_reach_the_plan() {
    let cli = parse(&[
        "--abandoned",
        "cancel",
        "--header-read-timeout",
        "2s",
        "--max-connections",
        "50",
        "--max-downstream-body",
        "64KiB",
        "--downstream",
        "http://127.0.0.1:9/api",
    ])
    .unwrap();
    let plan = cli.plan().unwrap();
    assert_eq!(plan.server.abandoned(), Abandoned::Cancel);
    assert_eq!(plan.server.header_read_timeout(), Duration::from_secs(2));
    assert_eq!(plan.server.max_connections().get(), 50);
    assert_eq!(plan.downstream.unwrap().max_body(), 64 * 1024);
}

#[test]
fn a_later_flag_overrides_an_earlier_one() {
    let cli = parse(&[
        "--backlog",
        "16",
        "--abandoned",
        "serve",
        "--backlog",
        "1024",
        "--abandoned",
        "cancel",
    ])
    .unwrap();
    assert_eq!(cli.backlog, 1024);
    assert_eq!(cli.abandoned, AbandonedArg::Cancel);
}

#[test]
fn mmc_defaults_follow_the_paper() {
    let cli = parse(&["--model", "mmc", "--seed", "3"]).unwrap();
    let plan = cli.plan().unwrap();
    let LatencyModel::Mmc(m) = plan.latency else {
        panic!("not mmc")
    };
    assert_eq!((m.workers().get(), m.seed()), (10, 3));
    assert_eq!(m.mean_service(), Duration::from_millis(50));
    let rl = cli.rate_limit_config();
    assert_eq!((rl.rate, rl.burst), (183, Some(10)));
}

#[test]
fn flags_reach_the_plan() {
    let cli = parse(&[
        "--listen",
        "127.0.0.1:0",
        "--stack",
        "none",
        "--rate-limit",
        "40",
        "--algorithm",
        "sliding-window",
        "--key",
        "ip",
        "--base-delay",
        "20ms",
        "--downstream",
        "http://127.0.0.1:9/api",
    ])
    .unwrap();
    let rl = cli.rate_limit_config();
    assert_eq!((rl.rate, rl.burst), (40, None));
    assert_eq!(rl.algorithm, Algorithm::SlidingWindow);
    assert_eq!(rl.key, KeyBy::Ip);
    let plan = cli.plan().unwrap();
    assert!(matches!(plan.stack, Stack::None));
    assert_eq!(
        plan.latency,
        LatencyModel::Article(
            ArticleModel::builder()
                .base(Duration::from_millis(20))
                .build()
                .unwrap()
        )
    );
    assert!(plan.downstream.is_some());
}

#[test]
fn stack_adaptive_has_no_rate_and_admin_is_opt_in() {
    let plan = parse(&[]).unwrap().plan().unwrap();
    assert!(!plan.admin);
    let cli = parse(&["--stack", "adaptive", "--admin", "--model", "mmc"]).unwrap();
    let plan = cli.plan().unwrap();
    assert!(plan.admin);
    let Stack::Adaptive { adaptive, .. } = plan.stack else {
        panic!("not the adaptive stack")
    };
    // The library's defaults, untouched by the demo: the stated initial limit, no probe
    // and no baseline before the first window closes.
    let status = adaptive.status();
    assert!(!status.probing, "no probe before anything is measured");
    assert_eq!(status.baseline, None);
    assert_eq!(status.limit, AdaptiveLimitLayer::DEFAULT_INITIAL_LIMIT);
}

#[test]
fn the_rate_limit_flags_take_every_name_of_the_library() {
    for algorithm in Algorithm::ALL {
        let cli = parse(&["--algorithm", algorithm.as_str()]).unwrap();
        assert_eq!(cli.algorithm, algorithm);
    }
    for key in KeyBy::ALL {
        let cli = parse(&["--key", key.as_str()]).unwrap();
        assert_eq!(cli.key, key);
    }
}

#[test]
fn bad_flags_are_clear_errors() {
    for (args, needle) in [
        (&["--stack", "half"][..], "invalid value 'half'"),
        (&["--listen", "localhost"], "invalid socket address"),
        (&["--rate-limit", "0"], "0 is not in 1.."),
        (&["--algorithm", "leaky-bucket"], "token-bucket"),
        (&["--base-delay", "soon"], "invalid duration \"soon\""),
        (&["--workers", "0"], "zero"),
        (&["--max-connections", "0"], "--max-connections"),
        (&["--max-downstream-body", "1MB"], "invalid size \"1MB\""),
        (&["--bogus"], "unexpected argument '--bogus'"),
    ] {
        let err = parse(args).unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn invalid_combinations_are_refused_by_the_plan() {
    for (args, needle) in [
        (
            &["--algorithm", "fixed-window", "--burst", "5"][..],
            "burst",
        ),
        (&["--base-delay", "0s"], "base delay must not be zero"),
        (&["--growth", "0.5"], "growth"),
        (&["--model", "mmc", "--mean-service", "0s"], "mean service"),
        (&["--downstream", "https://example.com/"], "http://"),
        (
            &[
                "--stack",
                "adaptive",
                "--redis-url",
                "redis://127.0.0.1:6379",
            ],
            "--redis-url keeps the rate limit of --stack full in Redis; --stack adaptive has none",
        ),
        (&["--downstream", "/api"], "http://"),
        (
            &["--header-read-timeout", "0s"],
            "--header-read-timeout must be greater than zero",
        ),
        (
            &["--skew-allowance", "2m"],
            "--skew-allowance must be at most 60s, got 120s",
        ),
        (
            &[
                "--stack",
                "deadline",
                "--redis-url",
                "redis://127.0.0.1:6379",
            ],
            "--stack deadline has none",
        ),
    ] {
        let Err(err) = parse(args).unwrap().plan() else {
            panic!("{args:?} was accepted")
        };
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn redis_flags_reach_the_plan_and_are_checked() {
    let cli = parse(&[
        "--redis-url",
        "redis://127.0.0.1:6390",
        "--redis-local-share",
        "0.25",
        "--redis-budget",
        "20ms",
    ])
    .unwrap();
    let redis = cli.redis_config().unwrap().unwrap();
    assert!((redis.local_share - 0.25).abs() < 1e-12);
    assert_eq!(redis.budget, Duration::from_millis(20));
    let plan = cli.plan().unwrap();
    assert_eq!(plan.redis.unwrap().addr(), "127.0.0.1:6390");
    // The defaults.
    let redis = parse(&["--redis-url", "redis://127.0.0.1"])
        .unwrap()
        .redis_config()
        .unwrap()
        .unwrap();
    assert_eq!(redis.budget, Duration::from_millis(5));
    assert!(parse(&[]).unwrap().redis_config().unwrap().is_none());
    // A Cluster from two seeds, a reservation, a cap on new keys.
    let cli = parse(&[
        "--redis-cluster",
        "--redis-url",
        "redis://127.0.0.1:7000",
        "--redis-url",
        "redis://127.0.0.1:7001",
        "--redis-reservation",
        "10",
        "--redis-max-new-keys",
        "50",
        "--burst",
        "30",
    ])
    .unwrap();
    let redis = cli.redis_config().unwrap().unwrap();
    assert!(redis.store.is_cluster());
    assert_eq!(redis.store.addr(), "127.0.0.1:7000,127.0.0.1:7001");
    assert_eq!((redis.reservation, redis.max_new_keys), (10, 50));
    assert!(cli.plan().is_ok());
    // A batch larger than the burst could never be filled.
    let err = parse(&[
        "--redis-url",
        "redis://127.0.0.1:7000",
        "--redis-reservation",
        "10",
    ])
    .unwrap()
    .plan()
    .err()
    .unwrap();
    assert!(
        err.contains("reservation must be at most the limit's capacity (5)"),
        "{err}"
    );
    // TLS, with a CA file.
    let dir = std::env::temp_dir().join(format!("demo-server-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("not-a-ca.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let err = parse(&[
        "--redis-url",
        "rediss://127.0.0.1:6380",
        "--redis-ca-cert",
        garbage.to_str().unwrap(),
    ])
    .unwrap()
    .plan()
    .err()
    .unwrap();
    assert!(
        err.starts_with("--redis-ca-cert: ca_certificate must hold"),
        "{err}"
    );
    let missing = dir.join("missing.pem");
    let err = parse(&[
        "--redis-url",
        "rediss://127.0.0.1:6380",
        "--redis-ca-cert",
        missing.to_str().unwrap(),
    ])
    .unwrap()
    .plan()
    .err()
    .unwrap();
    assert!(err.starts_with("--redis-ca-cert "), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        parse(&[
            "--redis-url",
            "redis://127.0.0.1",
            "--redis-client-cert",
            "c.pem"
        ])
        .is_err(),
        "a client certificate needs its key"
    );
    // Two URLs without --redis-cluster.
    let err = parse(&[
        "--redis-url",
        "redis://127.0.0.1:7000",
        "--redis-url",
        "redis://127.0.0.1:7001",
    ])
    .unwrap()
    .plan()
    .err()
    .unwrap();
    assert!(err.contains("--redis-cluster"), "{err}");
    // Settings without a URL, a bad URL, a bad share, a window Redis does not offer.
    assert!(parse(&["--redis-local-share", "0.5"]).is_err());
    assert!(parse(&["--redis-cluster"]).is_err());
    for (args, needle) in [
        (
            &["--redis-url", "http://127.0.0.1"][..],
            "--redis-url: url must be redis://",
        ),
        (
            &[
                "--redis-url",
                "redis://127.0.0.1",
                "--redis-local-share",
                "3",
            ],
            "local_share must be within (0, 1]",
        ),
        (
            &[
                "--redis-url",
                "redis://127.0.0.1",
                "--algorithm",
                "fixed-window",
            ],
            "token-bucket or sliding-window with Redis",
        ),
    ] {
        let Err(err) = parse(args).unwrap().plan() else {
            panic!("{args:?} was accepted")
        };
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn trusted_proxies_reach_the_overload_layer_of_either_stack() {
    let plan = parse(&[]).unwrap().plan().unwrap();
    assert!(plan.stack.overload().unwrap().trusted_proxies().is_none());
    for stack in ["full", "adaptive"] {
        let cli = parse(&[
            "--stack",
            stack,
            "--trusted-proxy",
            "127.0.0.1",
            "--trusted-proxy",
            "10.0.0.0/8",
            "--forwarded-header",
            "forwarded",
        ])
        .unwrap();
        let plan = cli.plan().unwrap();
        let proxies = plan.stack.overload().unwrap().trusted_proxies().unwrap();
        assert_eq!(proxies.header(), ForwardedHeader::Forwarded);
        assert_eq!(proxies.proxies().len(), 2, "{stack}");
    }
    let err = parse(&["--trusted-proxy", "0.0.0.0/0"])
        .unwrap()
        .plan()
        .err()
        .unwrap();
    assert!(err.contains("--trusted-proxy"), "{err}");
    assert!(parse(&["--trusted-proxy", "nope"]).is_err());
    assert!(parse(&["--forwarded-header", "forwarded"]).is_err());
}

#[test]
fn the_stop_rule_threshold_reaches_the_overload_layer() {
    let plan = parse(&[]).unwrap().plan().unwrap();
    let default = plan.stack.overload().unwrap().rule().retry_share();
    assert_eq!(default.to_bits(), StopRule::DEFAULT_RETRY_SHARE.to_bits());
    let plan = parse(&["--stop-retry-share", "0.5"])
        .unwrap()
        .plan()
        .unwrap();
    assert_eq!(
        plan.stack
            .overload()
            .unwrap()
            .rule()
            .retry_share()
            .to_bits(),
        0.5_f64.to_bits()
    );
    for bad in ["1", "-0.1", "NaN"] {
        let flag = format!("--stop-retry-share={bad}");
        let err = parse(&[flag.as_str()]).unwrap().plan().err().unwrap();
        assert!(err.contains("--stop-retry-share"), "{bad}: {err}");
    }
}

/// Issue 34: the benchmark's peers behind the same model, at the model's capacity.
#[test]
fn peer_stacks_take_the_models_capacity_and_latency() {
    let stack = |args: &[&str]| parse(args).unwrap().plan().unwrap().stack;
    let ten = NonZeroUsize::new(10).unwrap();
    let Stack::Peer(peer) = stack(&["--stack", "tower-shed", "--model", "mmc"]) else {
        panic!("not a peer")
    };
    assert_eq!(peer, Peer::tower_shed(ten), "the M/M/10 model's workers");
    let Stack::Peer(peer) = stack(&["--stack", "tower-shed"]) else {
        panic!("not a peer")
    };
    assert_eq!(
        peer,
        Peer::tower_shed(NonZeroUsize::new(30).unwrap()),
        "the article's knee"
    );
    let Stack::Peer(peer) = stack(&[
        "--stack",
        "tower-shed",
        "--model",
        "mmc",
        "--workers",
        "4",
        "--peer-concurrency",
        "7",
    ]) else {
        panic!("not a peer")
    };
    assert_eq!(peer, Peer::tower_shed(NonZeroUsize::new(7).unwrap()));
    let Stack::Peer(peer) = stack(&["--stack", "tower-resilience"]) else {
        panic!("not a peer")
    };
    assert_eq!(peer, Peer::tower_resilience());
    let Stack::Peer(peer) = stack(&["--stack", "little", "--model", "mmc"]) else {
        panic!("not a peer")
    };
    assert_eq!(
        peer,
        Peer::little(Duration::from_millis(100)).unwrap(),
        "twice the mean service time"
    );
    let Stack::Peer(peer) = stack(&["--stack", "little"]) else {
        panic!("not a peer")
    };
    assert_eq!(
        peer,
        Peer::little(Duration::from_millis(200)).unwrap(),
        "twice the article's base delay"
    );
    let Stack::Peer(peer) = stack(&["--stack", "little", "--little-target", "80ms"]) else {
        panic!("not a peer")
    };
    assert_eq!(peer, Peer::little(Duration::from_millis(80)).unwrap());
}

#[test]
fn peer_stacks_refuse_what_they_cannot_use() {
    for (args, needle) in [
        (
            &["--stack", "tower-shed", "--model", "instant"][..],
            "--stack tower-shed on the instant model needs --peer-concurrency",
        ),
        (
            &["--stack", "little", "--model", "instant"],
            "--stack little on the instant model needs --little-target",
        ),
        (
            &["--stack", "little", "--little-target", "0s"],
            "--little-target: little's target latency must be above zero, got 0ns",
        ),
        (
            &["--stack", "full", "--peer-concurrency", "3"],
            "--peer-concurrency is for --stack tower-shed",
        ),
        (
            &["--stack", "adaptive", "--little-target", "3ms"],
            "--little-target is for --stack little",
        ),
        (
            &["--stack", "little", "--redis-url", "redis://127.0.0.1:6379"],
            "--stack little has none",
        ),
    ] {
        let Err(err) = parse(args).unwrap().plan() else {
            panic!("{args:?} was accepted")
        };
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn the_full_stack_decides_in_the_process_without_redis_and_in_redis_with_it() {
    use demo_server::app::FullRateLimit;

    // Without Redis, the limit a README user composes: `RateLimitLayer<Local>`.
    let plan = parse(&[]).unwrap().plan().unwrap();
    assert!(
        matches!(
            plan.stack,
            Stack::Full {
                rate_limit: FullRateLimit::Local(_),
                ..
            }
        ),
        "{:?}",
        plan.stack
    );
    let plan = parse(&["--redis-url", "redis://127.0.0.1:6390"])
        .unwrap()
        .plan()
        .unwrap();
    assert!(
        matches!(
            plan.stack,
            Stack::Full {
                rate_limit: FullRateLimit::Redis(_),
                ..
            }
        ),
        "{:?}",
        plan.stack
    );
}

/// A file of its own in the system's temporary directory, removed when dropped.
struct LimitsFile(std::path::PathBuf);

impl LimitsFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "demo-server-limits-{}-{name}.toml",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for LimitsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn limits_from_a_file_take_the_place_of_the_rate_limit() {
    use demo_server::app::FullRateLimit;

    let file = LimitsFile::new(
        "good",
        "[default]\nrate = 100\n[[route]]\nexact = \"/api\"\nrate = 7\n",
    );
    let plan = parse(&["--limits", file.arg()]).unwrap().plan().unwrap();
    let Stack::Full {
        rate_limit: FullRateLimit::File(limits),
        ..
    } = &plan.stack
    else {
        panic!("{:?}", plan.stack)
    };
    assert_eq!(limits.current().limit_for("/api", None).rate(), 7);
    // The flags of the single limit, and Redis, are refused beside it.
    for other in [
        &["--rate-limit", "10"][..],
        &["--burst", "10"],
        &["--algorithm", "fixed-window"],
        &["--key", "ip"],
        &["--redis-url", "redis://127.0.0.1:6390"],
    ] {
        let mut args = vec!["--limits", file.arg()];
        args.extend_from_slice(other);
        let err = parse(&args).unwrap_err().to_string();
        assert!(err.contains("cannot be used with"), "{other:?}: {err}");
    }
    let err = parse(&["--limits", file.arg(), "--stack", "adaptive"])
        .unwrap()
        .plan()
        .err()
        .unwrap();
    assert_eq!(err, "--limits sets the rate limits of --stack full");
}

#[test]
fn a_bad_limits_file_stops_the_server_with_its_line_and_column() {
    let file = LimitsFile::new("bad", "[default]\nrate = 100\nburst = -1\n");
    let err = parse(&["--limits", file.arg()])
        .unwrap()
        .plan()
        .err()
        .unwrap();
    assert!(
        err.starts_with(&format!("--limits: {}:3:9: ", file.arg())),
        "{err}"
    );
    let missing = parse(&["--limits", "/nonexistent/limits.toml"])
        .unwrap()
        .plan()
        .err()
        .unwrap();
    assert!(
        missing.starts_with("--limits: /nonexistent/limits.toml: cannot read: "),
        "{missing}"
    );
}
