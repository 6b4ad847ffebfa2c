//! `demo-server --stack adaptive` from a fresh process, under a steady load it can serve
//! (finding 3 of issue 23): nothing is rejected, and `/healthz` always answers.
//!
//! The article model serves 30 requests at once at its no-load latency of 100 ms: 300 per
//! second. Half of that, 150 per second (about 15 in flight), is offered from the process's
//! first second, for 10 seconds, while `/healthz` is asked 10 times a second. Before the fix
//! the limit started at 3 and held there until 50 requests had completed, so most of the
//! first half second's requests were answered `503` (and, behind the overload layer, soon
//! the stop signal). The same load for 3 minutes is run by hand with oha (BENCHMARKS.md,
//! "The adaptive limit from a fresh process").
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

const BIN: &str = env!("CARGO_BIN_EXE_demo-server");
const RATE: u64 = 150;
const SECONDS: u64 = 10;

/// A child server, killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(args: &[&str]) -> Server {
    let mut child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--quiet"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the demo-server binary starts");
    let stdout = child.stdout.take().unwrap();
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).unwrap();
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in the startup line: {first:?}"));
    Server { child, addr }
}

#[derive(Debug, Default)]
struct Counts {
    ok: AtomicU64,
    rejected: AtomicU64,
    other: AtomicU64,
}

impl Counts {
    fn add(&self, status: StatusCode) {
        let counter = match status {
            StatusCode::OK => &self.ok,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => &self.rejected,
            _ => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> [u64; 3] {
        [&self.ok, &self.rejected, &self.other].map(|c| c.load(Ordering::Relaxed))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_adaptive_server_at_half_its_capacity_rejects_nothing() {
    let server = start(&["--stack", "adaptive"]);
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let (api, health) = (Arc::new(Counts::default()), Arc::new(Counts::default()));
    let run = async {
        let mut calls = JoinSet::new();
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        for i in 0..RATE * SECONDS {
            tick.tick().await;
            // Every fifteenth tick (10 a second) also asks `/healthz`.
            let paths: &[(&str, &Arc<Counts>)] = if i % 15 == 0 {
                &[("/api", &api), ("/healthz", &health)]
            } else {
                &[("/api", &api)]
            };
            for &(path, counts) in paths {
                let (client, counts) = (client.clone(), Arc::clone(counts));
                let request = Request::get(format!("http://{}{path}", server.addr))
                    .body(Empty::new())
                    .unwrap();
                calls.spawn(async move {
                    let response = client.request(request).await.expect("the server answers");
                    counts.add(response.status());
                });
            }
        }
        while let Some(done) = calls.join_next().await {
            done.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the test is bounded");
    let ([ok, rejected, other], health) = (api.get(), health.get());
    eprintln!("/api: {ok} ok, {rejected} rejected, {other} other; /healthz: {health:?}");
    assert_eq!(
        ok,
        RATE * SECONDS,
        "/api: {rejected} rejected, {other} other"
    );
    assert_eq!(
        health,
        [RATE * SECONDS / 15, 0, 0],
        "/healthz is never refused"
    );
}
