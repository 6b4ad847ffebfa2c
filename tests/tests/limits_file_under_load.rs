//! `demo-server --limits FILE` under load (issue 35): the file is rewritten while a greedy
//! client and a paced one run, and the new limit is in force within a second, with nothing
//! the new limit admits rejected and no 5xx; then a broken file changes nothing, says why
//! in the server's log, and is counted on `/metrics`.
//!
//! A binary of its own: real traffic for about ten seconds, whose rates it counts. The
//! server is a real `demo-server` process on 127.0.0.1 (built by
//! `cargo build --workspace --bin demo-server` from this test); the clients are hyper
//! clients in the test, the greedy one from 127.0.0.1 and the paced one from 127.0.0.2 (every
//! 127/8 address is the loopback on Linux), so that the file's per-client-IP limit gives
//! each its own bucket.

#![cfg(target_os = "linux")]

use std::ffi::OsString;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use demo_client::process::ServerProcess;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

/// The greedy client's concurrent loops.
const GREEDY_LOOPS: usize = 8;
/// The paced client's rate: 50 per second, half the new limit.
const PACED_INTERVAL: Duration = Duration::from_millis(20);
const BEFORE: &str = "[default]\nrate = 1000\n";
/// The new limit: 100 per second, bursts of 100, per client IP.
const AFTER: &str = "[default]\nrate = 100\n";
const NEW_RATE: u64 = 100;
const NEW_BURST: u64 = 100;
/// A broken file: refused at line 2, column 8.
const BROKEN: &str = "[default]\nrate = 0\n";

/// One answer: when it came and its status.
type Answer = (Instant, StatusCode);

/// A file of its own in the system's temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let file = Self(
            std::env::temp_dir().join(format!("limits-under-load-{}-{name}", std::process::id())),
        );
        file.write(text);
        file
    }

    /// Written whole then renamed over, as an editor saves.
    fn write(&self, text: &str) {
        let tmp = self.0.with_extension("tmp");
        std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn client(from: Ipv4Addr) -> Client<HttpConnector, Empty<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(IpAddr::V4(from)));
    Client::builder(TokioExecutor::new()).build(connector)
}

async fn get(client: &Client<HttpConnector, Empty<Bytes>>, url: &str) -> (StatusCode, Bytes) {
    let request = Request::get(url).body(Empty::new()).unwrap();
    let response = client.request(request).await.expect("the server answers");
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

/// The admitted answers that came within `from..to`.
fn admitted(answers: &[Answer], from: Instant, to: Instant) -> u64 {
    let n = answers
        .iter()
        .filter(|(at, status)| *status == StatusCode::OK && (from..to).contains(at))
        .count();
    u64::try_from(n).unwrap()
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_limits_file_is_in_force_within_a_second_and_a_broken_one_changes_nothing() {
    let binary = integration_tests::workspace_binary("demo-server");
    let limits = TempFile::new("limits.toml", BEFORE);
    let log_path = std::env::temp_dir().join(format!(
        "limits-under-load-{}-server.log",
        std::process::id()
    ));
    let log = std::fs::File::create(&log_path).unwrap();
    let args: Vec<OsString> = ["--model", "instant", "--quiet", "--limits"]
        .into_iter()
        .map(OsString::from)
        .chain([limits.0.clone().into_os_string()])
        .collect();
    let server = ServerProcess::start(&binary, &args, Some(log))
        .await
        .unwrap();
    let addr: SocketAddr = server.addr();
    let url = format!("http://{addr}/api");

    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        let stop = Arc::new(AtomicBool::new(false));
        // The greedy client: as fast as it can, from 127.0.0.1.
        let greedy: Vec<_> = (0..GREEDY_LOOPS)
            .map(|_| {
                let (client, url, stop) =
                    (client(Ipv4Addr::LOCALHOST), url.clone(), Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut answers: Vec<Answer> = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let (status, _) = get(&client, &url).await;
                        answers.push((Instant::now(), status));
                    }
                    answers
                })
            })
            .collect();
        // The paced client: one request every 20 ms, from 127.0.0.2, each on its own task
        // so that a slow answer does not delay the next.
        let paced = {
            let (client, url, stop) = (
                client(Ipv4Addr::new(127, 0, 0, 2)),
                url.clone(),
                Arc::clone(&stop),
            );
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(PACED_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let mut sent = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let (client, url) = (client.clone(), url.clone());
                    sent.push(tokio::spawn(async move { get(&client, &url).await.0 }));
                }
                let mut statuses = Vec::new();
                for request in sent {
                    statuses.push(request.await.unwrap());
                }
                statuses
            })
        };

        let start = Instant::now();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        limits.write(AFTER);
        let rewritten = Instant::now();
        tokio::time::sleep(Duration::from_millis(3_200)).await;
        limits.write(BROKEN);
        let broken = Instant::now();
        tokio::time::sleep(Duration::from_millis(3_200)).await;
        stop.store(true, Ordering::Relaxed);

        let mut answers: Vec<Answer> = Vec::new();
        for task in greedy {
            answers.extend(task.await.unwrap());
        }
        answers.sort_by_key(|(at, _)| *at);
        let paced = paced.await.unwrap();
        (start, rewritten, broken, answers, paced)
    })
    .await;
    let (start, rewritten, broken, answers, paced) = outcome.expect("the run ends within 60 s");
    let s = Duration::from_secs;
    let ms = Duration::from_millis;

    // Every answer is 200 or 429: no 5xx, no stop signal (the clients send no retries).
    for (_, status) in &answers {
        assert!(
            *status == StatusCode::OK || *status == StatusCode::TOO_MANY_REQUESTS,
            "greedy client got {status}"
        );
    }
    // The paced client, at half the new limit, is never refused: nothing the new limit
    // admits is rejected.
    assert!(paced.len() >= 300, "paced client sent {}", paced.len());
    assert!(
        paced.iter().all(|status| *status == StatusCode::OK),
        "paced client: {:?}",
        paced.iter().filter(|s| **s != StatusCode::OK).count()
    );

    // Before: the greedy client gets well above the new limit.
    let before = admitted(&answers, start + ms(500), rewritten);
    assert!(
        before >= 3 * NEW_RATE,
        "greedy client admitted {before} in the second before the change"
    );
    // From 1 s after the write, at most the new rate plus its burst (the bound of a token
    // bucket over any window, which holds from the change on); a change taking effect even
    // 100 ms late would add 100 more at the old rate. A few answers in flight across the
    // window's edge are allowed for.
    let after = admitted(&answers, rewritten + s(1), rewritten + s(3));
    assert!(
        after <= 2 * NEW_RATE + NEW_BURST + GREEDY_LOOPS as u64,
        "greedy client admitted {after} within 1..3 s of the change"
    );
    assert!(
        after >= NEW_RATE,
        "greedy client admitted only {after} within 1..3 s of the change"
    );
    // The broken file: the limits stay as they were, measured the same way.
    let kept = admitted(&answers, broken + s(1), broken + s(3));
    assert!(
        (NEW_RATE..=2 * NEW_RATE + NEW_BURST + GREEDY_LOOPS as u64).contains(&kept),
        "greedy client admitted {kept} within 1..3 s of the broken file"
    );

    // The log says what changed and why the broken file was refused, with its position.
    let log = log_of(&log_path);
    assert!(log.contains("limits file reloaded"), "{log}");
    assert!(
        log.contains("default: 1000/1s burst 1000 -> 100/1s burst 100"),
        "{log}"
    );
    assert!(
        log.contains("limits file refused, the limits in force are kept"),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "{}:2:8: [default]: rate must be at least 1, got 0",
            limits.0.display()
        )),
        "{log}"
    );
    // Counted once, on /metrics.
    let (status, metrics) = get(
        &client(Ipv4Addr::LOCALHOST),
        &format!("http://{addr}/metrics"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let metrics = String::from_utf8_lossy(&metrics);
    let refused: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("ratelimit_layer_limits_reloads_total{")
                && l.contains("result=\"refused\"")
        })
        .collect();
    assert_eq!(refused.len(), 1, "{metrics}");
    assert!(refused[0].ends_with(" 1"), "{}", refused[0]);
    let applied: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("ratelimit_layer_limits_reloads_total{")
                && l.contains("result=\"applied\"")
        })
        .collect();
    assert_eq!(applied.len(), 1, "{metrics}");
    assert!(applied[0].ends_with(" 1"), "{}", applied[0]);

    // When the change took effect, as seen by the greedy client: the first 100 ms after the
    // write from which no 100 ms holds more than the new rate's share plus the burst.
    let effect = (0..30)
        .map(|i| rewritten + ms(100) * i)
        .find(|&from| {
            admitted(&answers, from, from + ms(100)) <= NEW_RATE / 10 + GREEDY_LOOPS as u64
        })
        .map(|at| at - rewritten);
    println!(
        "greedy admitted: {before} in the second before the change, {after} in 1..3 s after it, \
         {kept} in 1..3 s after the broken file; change seen after {effect:?}; paced: {} sent, \
         all admitted",
        paced.len()
    );
    drop(server);
    let _ = std::fs::remove_file(&log_path);
}
