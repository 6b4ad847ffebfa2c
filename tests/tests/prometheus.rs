//! The operators' files in `ops/`, tested with Debian's `prometheus` package:
//!
//! - the recording and alerting rules pass `promtool check rules`, and their unit tests
//!   (`promtool test rules`, on series shaped like a demo-server scrape) pass;
//! - a real Prometheus on 127.0.0.1 scrapes two running `demo-server` processes (a top tier
//!   with the adaptive limit whose handler calls the bottom tier through the retry layer; a
//!   bottom tier with the overload layer, the deadline layer and a per-client rate limit,
//!   which also gets requests whose deadline has passed) and a third with a limit kept in
//!   Redis, loads the rules, and **every query of the Grafana dashboard**
//!   returns data.
//!
//! `prometheus` and `promtool` must be on the `PATH` (`scripts/test` installs them on Debian
//! and Ubuntu), or named by `PROMETHEUS` and `PROMTOOL`; the test fails, never skips, without
//! them. Every process is started on 127.0.0.1 by this test and stopped by its PID.

#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use integration_tests::workspace_binary;
use ratelimit_layer::redis::testing::RedisServer;
use serde_json::Value;
use tokio::time::Instant;

fn ops() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops")
}

/// A tool of Debian's `prometheus` package, from `$VAR` or the `PATH`.
fn tool(name: &str, var: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return PathBuf::from(path);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on the PATH: install Debian's `prometheus` package \
                 (`scripts/test` does), or set {var} to the binary"
            )
        })
}

#[test]
fn promtool_checks_and_unit_tests_the_rules() {
    let promtool = tool("promtool", "PROMTOOL");
    let dir = ops().join("prometheus");
    let check = Command::new(&promtool)
        .args(["check", "rules", "tower-overload.rules.yml"])
        .current_dir(&dir)
        .output()
        .expect("promtool runs");
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "promtool check rules failed:\n{out}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(out.contains("SUCCESS"), "{out}");

    let test = Command::new(&promtool)
        .args(["test", "rules", "tower-overload.rules.test.yml"])
        .current_dir(&dir)
        .output()
        .expect("promtool runs");
    let out = String::from_utf8_lossy(&test.stdout);
    assert!(
        test.status.success(),
        "promtool test rules failed:\n{out}{}",
        String::from_utf8_lossy(&test.stderr)
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

/// A process this test started, stopped by its PID when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A directory of this test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "tower-overload-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts `demo-server` on 127.0.0.1, port 0, and reads its address from its first line.
fn demo_server(binary: &Path, args: &[&str]) -> (Process, SocketAddr) {
    let mut child = Command::new(binary)
        .args(["--listen", "127.0.0.1:0", "--quiet"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the demo-server binary starts");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut first)
        .expect("demo-server prints its address");
    let process = Process(child);
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in demo-server's first line: {first:?}"));
    (process, addr)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

async fn get(client: &HttpClient, uri: &str) -> Option<(u16, String)> {
    let response = client.get(uri.parse().ok()?).await.ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `GET uri` with an `X-Request-Deadline` that passed 8 s ago; the status.
async fn get_expired(client: &HttpClient, uri: &str) -> Option<u16> {
    let mut request = http::Request::get(uri).body(Empty::new()).ok()?;
    overload_signal::protocol::WireDeadline::new(
        std::time::SystemTime::now() - Duration::from_secs(10),
        Duration::from_secs(2),
    )
    .set(request.headers_mut());
    Some(client.request(request).await.ok()?.status().as_u16())
}

/// Percent-encodes a query parameter (everything but RFC 3986's unreserved characters).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The series an instant query returns (empty on any error).
async fn query(client: &HttpClient, prometheus: SocketAddr, expr: &str) -> Vec<Value> {
    let uri = format!("http://{prometheus}/api/v1/query?query={}", encode(expr));
    let Some((200, body)) = get(client, &uri).await else {
        return Vec::new();
    };
    serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["data"]["result"].as_array().cloned())
        .unwrap_or_default()
}

/// Every query of the dashboard (panel targets and template variables), with the
/// variables set as "All" sets them.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(ops().join("grafana/tower-overload.json"))
        .expect("the dashboard exists");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let all = |expr: &str| expr.replace("$job", ".+").replace("$instance", ".+");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a target has an expression");
            let title = panel["title"].as_str().unwrap_or_default();
            queries.push((title.to_owned(), all(expr)));
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        let Some(definition) = variable["definition"].as_str() else {
            continue;
        };
        // `label_values(selector, label)`: the selector's series must exist.
        let selector = definition
            .strip_prefix("label_values(")
            .and_then(|rest| rest.rsplit_once(','))
            .map(|(selector, _)| selector.trim())
            .expect("template variables are label_values(selector, label)");
        queries.push((format!("variable {}", variable["name"]), all(selector)));
    }
    queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_demo_server_and_every_dashboard_query_returns_data() {
    let prometheus_bin = tool("prometheus", "PROMETHEUS");
    let demo = workspace_binary("demo-server");
    let redis = RedisServer::start();
    let redis_url = redis.url();

    // Bottom tier: the overload layer outside a per-client rate limit of 20/s.
    let (_bottom, bottom) = demo_server(
        &demo,
        &["--model", "instant", "--rate-limit", "20", "--key", "ip"],
    );
    // A server whose limit (100/s) is kept in Redis, as a fleet's is.
    let (_fleet, fleet) = demo_server(
        &demo,
        &[
            "--model",
            "instant",
            "--rate-limit",
            "100",
            "--redis-url",
            &redis_url,
        ],
    );
    // Top tier: the adaptive limit; its handler calls the bottom tier through the retry layer.
    let downstream = format!("http://{bottom}/api");
    let (_top, top) = demo_server(
        &demo,
        &[
            "--model",
            "instant",
            "--stack",
            "adaptive",
            "--downstream",
            &downstream,
        ],
    );

    let dir = TempDir::new("prometheus");
    let rules = ops().join("prometheus/tower-overload.rules.yml");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {}\n\
         scrape_configs:\n  - job_name: demo-server\n    static_configs:\n      - targets: ['{bottom}', '{top}', '{fleet}']\n",
        rules.canonicalize().expect("the rules exist").display()
    );
    std::fs::write(dir.0.join("prometheus.yml"), config).expect("the config is written");
    let port = free_port();
    let _prometheus = Process(
        Command::new(&prometheus_bin)
            .arg(format!(
                "--config.file={}",
                dir.0.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );
    let prometheus: SocketAddr = ([127, 0, 0, 1], port).into();
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();

    let ready_by = Instant::now() + Duration::from_secs(30);
    while get(&client, &format!("http://{prometheus}/-/ready"))
        .await
        .map(|r| r.0)
        != Some(200)
    {
        assert!(
            Instant::now() < ready_by,
            "prometheus was not ready within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Traffic for 8 s: bursts of 10 requests at once, 10 bursts a second, to the top tier.
    // The bottom tier admits 20 a second: the rest come back 429, the top tier's retry layer
    // retries some (its budget refuses the rest) and the bottom tier's histogram sees them.
    // And 2 requests a tick to the server whose limit is in Redis. And one a tick to the
    // bottom tier sent 10 s ago with a 2 s deadline, which its deadline layer answers `504`.
    let targets = [
        (format!("http://{top}/api"), 10),
        (format!("http://{fleet}/api"), 2),
    ];
    let expired = format!("http://{bottom}/api");
    let traffic = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for _ in 0..80 {
                tick.tick().await;
                for (target, n) in &targets {
                    for _ in 0..*n {
                        let (client, target) = (client.clone(), target.clone());
                        tokio::spawn(async move { get(&client, &target).await });
                    }
                }
                let (client, expired) = (client.clone(), expired.clone());
                tokio::spawn(async move { get_expired(&client, &expired).await });
            }
        })
    };
    traffic.await.expect("the traffic task ends");

    // Every dashboard query returns data once two scrapes and a rule evaluation have seen the
    // traffic; poll each for up to 20 s.
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{} queries", queries.len());
    let mut missing = Vec::new();
    for (title, expr) in &queries {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if !query(&client, prometheus, expr).await.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                missing.push(format!("{title}: {expr}"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    assert!(
        missing.is_empty(),
        "dashboard queries without data:\n{}",
        missing.join("\n")
    );

    // Each layer's series carry its name, and the alert rules were loaded.
    for metric in [
        "backoff_layer_requests_total",
        "overload_signal_stop_signals_total",
        "overload_signal_deadline_expired_total",
        "ratelimit_layer_requests_rejected_total",
        "ratelimit_layer_adaptive_limit",
    ] {
        let series = query(&client, prometheus, metric).await;
        assert!(!series.is_empty(), "{metric}");
        for s in &series {
            assert!(
                s["metric"]["name"].is_string(),
                "{metric} has no `name` label: {s}"
            );
        }
    }
    // The top tier's retry layer counts its effective and actual outcomes per destination:
    // the bottom tier, named by its address (host and port).
    for metric in [
        "backoff_layer_request_outcomes_total",
        "backoff_layer_attempt_outcomes_total",
    ] {
        let series = query(&client, prometheus, metric).await;
        assert!(
            series
                .iter()
                .any(|s| s["metric"]["server_address"] == bottom.to_string().as_str()),
            "{metric} has no series for server_address=\"{bottom}\": {series:?}"
        );
    }
    let uri = format!("http://{prometheus}/api/v1/rules?type=alert");
    let (_, rules) = get(&client, &uri).await.expect("the rules API answers");
    assert!(rules.contains("TowerOverloadStopSignal"), "{rules}");
}
