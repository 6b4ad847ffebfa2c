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

mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::Server;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

const RATE: u64 = 150;
const SECONDS: u64 = 10;

/// A child `demo-server` (see `support::start`).
fn start_server(args: &[&str]) -> Server {
    support::start(args, Stdio::null())
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
    let server = start_server(&["--stack", "adaptive"]);
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
