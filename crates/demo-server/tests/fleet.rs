//! One limit for a fleet, with real processes: three `demo-server`s with `--redis-url`
//! sharing 300 req/s under three times that load, a local-only control run, and Redis
//! stopped and restarted under load; the same on a Redis Cluster (3 masters with a replica
//! each), keys on every slot, and a master lost and its replica promoted under load.
//!
//! Everything runs on 127.0.0.1: the `redis-server`s the tests start (and kill)
//! themselves, the three servers (killed on drop, whatever happens), and an open-loop load
//! generator that sends 9 requests every 10 ms (900 req/s) spread evenly over the servers.
//! Each run lasts a few seconds.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ratelimit_layer::redis::testing::{RedisCluster, RedisServer};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

const BIN: &str = env!("CARGO_BIN_EXE_demo-server");

/// The fleet's limit, requests per second.
const LIMIT: u32 = 300;

/// Requests per tick (three per server) and the tick: 900 req/s, three times the limit.
const PER_TICK: usize = 9;
const TICK: Duration = Duration::from_millis(10);

/// A `demo-server` child, killed on drop.
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

fn start(extra: &[&str]) -> Server {
    let mut child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--quiet", "--model", "instant"])
        .args(["--rate-limit", &LIMIT.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the demo-server binary starts");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok());
    let Some(addr) = addr else {
        let _ = child.kill();
        panic!("no address in the startup line: {first:?}");
    };
    Server { child, addr }
}

fn fleet(extra: &[&str]) -> Vec<Server> {
    (0..3).map(|_| start(extra)).collect()
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// What one request got: the tick it was sent in and its status (0: no response).
type Outcome = (usize, u16);

/// The outcomes of a load run, and when each tick was sent (and one more: when the run
/// ended), so that rates are per second of real time even when a loaded machine sent some
/// ticks late.
struct Run {
    outcomes: Vec<Outcome>,
    times: Vec<Instant>,
}

impl Run {
    /// Requests admitted (200) among those sent in ticks `from..to`.
    fn admitted(&self, from: usize, to: usize) -> u32 {
        let n = self
            .outcomes
            .iter()
            .filter(|(tick, status)| (from..to).contains(tick) && *status == 200)
            .count();
        u32::try_from(n).unwrap()
    }

    /// Seconds of real time from tick `from` to tick `to`.
    fn seconds(&self, from: usize, to: usize) -> f64 {
        (self.times[to] - self.times[from]).as_secs_f64()
    }

    /// Admitted per second of real time over ticks `from..to`.
    fn rate(&self, from: usize, to: usize) -> f64 {
        f64::from(self.admitted(from, to)) / self.seconds(from, to)
    }
}

/// The runs start three servers each and send 900 req/s: one at a time, so that they do
/// not share the two cores with each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sends `PER_TICK` requests every tick for `ticks` ticks, round-robin over `servers`,
/// calling `at_tick` before each tick (to stop or restart Redis at a chosen time), and
/// returns every outcome once all have answered.
async fn load(servers: &[Server], ticks: usize, mut at_tick: impl FnMut(usize)) -> Run {
    let client = client();
    let uris: Vec<http::Uri> = servers
        .iter()
        .map(|s| format!("http://{}/api", s.addr).parse().unwrap())
        .collect();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut times = Vec::with_capacity(ticks + 1);
    let mut ticker = tokio::time::interval(TICK);
    // NOTE: late ticks are caught up, so the offered count is exact.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Burst);
    for tick in 0..ticks {
        ticker.tick().await;
        times.push(Instant::now());
        at_tick(tick);
        for i in 0..PER_TICK {
            let (client, uri, tx) = (client.clone(), uris[i % uris.len()].clone(), tx.clone());
            tokio::spawn(async move {
                let status =
                    match tokio::time::timeout(Duration::from_secs(5), client.get(uri)).await {
                        Ok(Ok(response)) => {
                            let status = response.status().as_u16();
                            let _ = response.into_body().collect().await;
                            status
                        }
                        _ => 0,
                    };
                let _ = tx.send((tick, status));
            });
        }
    }
    ticker.tick().await;
    times.push(Instant::now());
    drop(tx);
    let mut outcomes = Vec::with_capacity(ticks * PER_TICK);
    while let Some(outcome) = rx.recv().await {
        outcomes.push(outcome);
    }
    Run { outcomes, times }
}

/// Every response was a 200 or the limiter's 429: no 5xx, no failed connection.
fn only_200_and_429(outcomes: &[Outcome]) {
    let odd: Vec<_> = outcomes
        .iter()
        .filter(|(_, status)| *status != 200 && *status != 429)
        .collect();
    assert!(
        odd.is_empty(),
        "{} responses other than 200 or 429 (0: no response), first: {:?}",
        odd.len(),
        &odd[..odd.len().min(5)]
    );
}

/// One `GET /metrics` line's value, by its prefix.
async fn metric(client: &HttpClient, server: &Server, prefix: &str) -> Option<f64> {
    metric_at(client, server.addr, prefix).await
}

/// One `GET /metrics` line's value of the server at `addr`, by its prefix.
async fn metric_at(client: &HttpClient, addr: SocketAddr, prefix: &str) -> Option<f64> {
    let uri: http::Uri = format!("http://{addr}/metrics").parse().unwrap();
    let response = client.get(uri).await.ok()?;
    let body = response.into_body().collect().await.ok()?.to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    text.lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

const FALLBACKS: &str = "ratelimit_layer_redis_fallbacks_total";
const UP: &str = "ratelimit_layer_redis_up{name=\"default\"}";

async fn fallbacks(client: &HttpClient, servers: &[Server]) -> f64 {
    let mut total = 0.0;
    for server in servers {
        for reason in ["timeout", "error", "unavailable"] {
            let prefix = format!("{FALLBACKS}{{name=\"default\",reason=\"{reason}\"}}");
            total += metric(client, server, &prefix).await.unwrap_or(0.0);
        }
    }
    total
}

/// The test: three servers share 300 req/s (bursts of 30) through Redis; 900 req/s
/// offered for 4 s admit 300 per second of the run plus the burst, within 5 %. The control
/// run, without Redis, admits about three times as much.
///
/// The servers take the whole limit as their local share (the default), so a decision
/// that fell back would admit beyond the shared limit and show in the count; the fallback
/// counters must stay at zero. The budget is 250 ms rather than the default 5 ms: this test
/// is about sharing, and on a loaded 2-core machine a round trip occasionally takes longer
/// than 5 ms, and was seen to take longer than 50 ms with other builds running (the fault
/// test below covers falling back). The burst of 30 (0.1 s of
/// the limit) keeps a late tick on a loaded machine from wasting tokens a full bucket
/// would drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_share_one_limit_through_redis() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let url = redis.url();
    let servers = fleet(&[
        "--burst",
        "30",
        "--redis-url",
        &url,
        "--redis-budget",
        "250ms",
    ]);
    let ticks = 400;
    let run = load(&servers, ticks, |_| {}).await;
    only_200_and_429(&run.outcomes);
    let total = run.admitted(0, ticks);
    let expected = f64::from(LIMIT) * run.seconds(0, ticks) + 30.0;
    let error = (f64::from(total) - expected).abs() / expected;
    println!(
        "shared: {total} admitted of {} offered in {:.2} s, expected {expected:.0}",
        run.outcomes.len(),
        run.seconds(0, ticks)
    );
    assert!(
        error <= 0.05,
        "admitted {total}, expected {expected:.0} (error {:.1} %)",
        error * 100.0
    );
    let client = client();
    assert!(
        fallbacks(&client, &servers).await.abs() < f64::EPSILON,
        "no fallback"
    );
    drop(servers);

    // The control: the same fleet, each server with its own local limit.
    let servers = fleet(&["--burst", "30"]);
    let run = load(&servers, ticks, |_| {}).await;
    only_200_and_429(&run.outcomes);
    let local = run.admitted(0, ticks);
    println!("local only: {local} admitted");
    assert!(
        f64::from(local) > 2.5 * expected,
        "three local limits admitted {local}, about 3 x {expected:.0} expected"
    );
}

/// Redis stopped under load: the servers keep answering, 200 or 429, each admitting its
/// local share (half the limit, so that the fallback is visible: 450 req/s in all instead
/// of 300); Redis restarted: the fleet admits the shared 300 req/s again from 2 s after
/// the restart (were any server still falling back, the rate would be higher), and every
/// server reports that Redis decides. A stopped Redis refuses connections at once, so the
/// budget (250 ms, as above) does not slow the fallback; it keeps a slow round trip on a
/// loaded machine from being taken for an outage after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_and_restarted_under_load() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start();
    let url = redis.url();
    let servers = fleet(&[
        "--burst",
        "30",
        "--redis-url",
        &url,
        "--redis-local-share",
        "0.5",
        "--redis-budget",
        "250ms",
    ]);
    // 2 s with Redis, 3 s without, 4 s with it again.
    let (stop, restart, end) = (200, 500, 900);
    let run = load(&servers, end, |tick| {
        if tick == stop {
            redis.stop();
        } else if tick == restart {
            redis.restart();
        }
    })
    .await;
    only_200_and_429(&run.outcomes);

    // With Redis (the first 2 s include the burst); without it, after its first second;
    // with it again, from 2 s after the restart.
    let before = run.rate(0, stop);
    let without = run.rate(stop + 100, restart);
    let after = run.rate(restart + 200, end);
    println!("admitted per second: {before:.0} with Redis, {without:.0} without, {after:.0} after");
    assert!((before - 315.0).abs() <= 0.05 * 315.0, "{before}");
    assert!((without - 450.0).abs() <= 0.05 * 450.0, "{without}");
    assert!((after - 300.0).abs() <= 0.05 * 300.0, "{after}");

    let client = client();
    for server in &servers {
        assert_eq!(metric(&client, server, UP).await, Some(1.0));
    }
    assert!(fallbacks(&client, &servers).await > 0.0);
}

/// Each server's `ratelimit_layer_redis_up`.
async fn up_gauges(client: &HttpClient, servers: &[Server]) -> Vec<Option<f64>> {
    let mut ups = Vec::with_capacity(servers.len());
    for server in servers {
        ups.push(metric(client, server, UP).await);
    }
    ups
}

/// Three servers on a Redis Cluster, each seeded with a different node.
fn cluster_fleet(cluster: &RedisCluster, extra: &[&str]) -> Vec<Server> {
    (0..3)
        .map(|i| {
            let url = &cluster.urls()[i];
            let mut args = vec!["--redis-cluster", "--redis-url", url];
            args.extend_from_slice(extra);
            start(&args)
        })
        .collect()
}

/// The Cluster test, first part: a Redis Cluster of 3 masters with a replica each;
/// three servers, each seeded with a different node, share 300 req/s within 5 % (900 req/s
/// offered for 4 s), every decision made in Redis (no fallback counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_share_one_limit_through_a_redis_cluster() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3, 1);
    let servers = cluster_fleet(&cluster, &["--burst", "30", "--redis-budget", "250ms"]);
    let ticks = 400;
    let run = load(&servers, ticks, |_| {}).await;
    only_200_and_429(&run.outcomes);
    let total = run.admitted(0, ticks);
    let expected = f64::from(LIMIT) * run.seconds(0, ticks) + 30.0;
    let error = (f64::from(total) - expected).abs() / expected;
    println!(
        "Cluster: {total} admitted of {} offered in {:.2} s, expected {expected:.0}",
        run.outcomes.len(),
        run.seconds(0, ticks)
    );
    assert!(
        error <= 0.05,
        "admitted {total}, expected {expected:.0} (error {:.1} %)",
        error * 100.0
    );
    let client = client();
    assert!(
        fallbacks(&client, &servers).await.abs() < f64::EPSILON,
        "no fallback"
    );
}

/// The Cluster test, second part: a keyed limit (per client address) over 120
/// keys, which land on every master's slots, is decided in Redis: no fallback counted, and
/// every master holds keys. The clients bind 120 different loopback addresses
/// (127.0.0.0/8 is all loopback on Linux), one key each.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_on_every_slot_are_decided_in_the_cluster() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3, 1);
    // NOTE: a sliding window, whose keys live two windows (2 s), long enough to be
    // counted on their nodes after the run.
    let servers = cluster_fleet(
        &cluster,
        &[
            "--key",
            "ip",
            "--algorithm",
            "sliding-window",
            "--redis-budget",
            "250ms",
        ],
    );
    let mut tasks = Vec::new();
    for i in 0..120u8 {
        let local = std::net::IpAddr::from([127, 0, 1, i + 1]);
        let uri: http::Uri = format!("http://{}/api", servers[usize::from(i) % 3].addr)
            .parse()
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let mut connector = HttpConnector::new();
            connector.set_local_address(Some(local));
            let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
            let mut statuses = Vec::new();
            for _ in 0..3 {
                let status = match client.get(uri.clone()).await {
                    Ok(response) => response.status().as_u16(),
                    Err(_) => 0,
                };
                statuses.push(status);
            }
            statuses
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), [200, 200, 200], "three of a key's 300");
    }
    let client = client();
    assert!(
        fallbacks(&client, &servers).await.abs() < f64::EPSILON,
        "no fallback"
    );
    let masters: std::collections::BTreeSet<usize> = [0, 5_461, 10_923]
        .iter()
        .map(|slot| cluster.master_of(*slot))
        .collect();
    assert_eq!(masters.len(), 3);
    for master in masters {
        let keys: u64 = cluster.nodes()[master]
            .command("DBSIZE")
            .trim_start_matches(':')
            .parse()
            .unwrap();
        assert!(keys >= 10, "master {master} holds {keys} of the 120 keys");
    }
}

/// The Cluster test, third part: under 900 req/s, the master that holds the
/// fleet's key is killed (SIGKILL) and its replica promoted by the Cluster (node timeout
/// 1 s). No response is a server error; each server falls back to its local share (half
/// the limit here, so that the fallback shows) for a few seconds at most after the replica
/// is promoted; then the fleet admits the shared 300 req/s again, decided in the Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_lost_and_its_replica_promoted_under_load() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let _alone = ONE_AT_A_TIME.lock().await;
    let mut cluster = RedisCluster::start(3, 1);
    let slot: u16 = cluster.nodes()[0]
        .command("CLUSTER KEYSLOT ratelimit:default:tb:g")
        .trim_start_matches(':')
        .parse()
        .unwrap();
    let master = cluster.master_of(slot);
    let killed_port = cluster.nodes()[master].port();
    let survivors: Vec<u16> = cluster
        .nodes()
        .iter()
        .map(|n| n.port())
        .filter(|p| *p != killed_port)
        .collect();
    let servers = cluster_fleet(
        &cluster,
        &[
            "--burst",
            "30",
            "--redis-local-share",
            "0.5",
            "--redis-budget",
            "250ms",
        ],
    );
    // Each server's `up` gauge, every 100 ms, while the load runs: the longest stretch at 0,
    // and when the last one ended (from the start of the run).
    let watching = Arc::new(AtomicBool::new(true));
    let started = Instant::now();
    let watcher = {
        let watching = Arc::clone(&watching);
        let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
        tokio::spawn(async move {
            let client = client();
            let mut away_since = vec![None; addrs.len()];
            let mut longest = vec![Duration::ZERO; addrs.len()];
            let mut back_at = Duration::ZERO;
            while watching.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                for (i, addr) in addrs.iter().enumerate() {
                    let up = metric_at(&client, *addr, UP).await;
                    match (up == Some(0.0), away_since[i]) {
                        (true, None) => away_since[i] = Some(Instant::now()),
                        (false, Some(since)) => {
                            let away: Duration = Instant::now() - since;
                            longest[i] = longest[i].max(away);
                            back_at = back_at.max(started.elapsed());
                            away_since[i] = None;
                        }
                        _ => {}
                    }
                }
            }
            for (i, since) in away_since.iter().enumerate() {
                if let Some(since) = since {
                    longest[i] = longest[i].max(Instant::now() - *since);
                    back_at = Duration::MAX;
                }
            }
            (longest, back_at)
        })
    };
    // When the Cluster promotes a replica for the slot, from the start of the run.
    let promotion = {
        let watching = Arc::clone(&watching);
        std::thread::spawn(move || {
            while watching.load(Ordering::Relaxed) {
                if let Some(port) = RedisCluster::master_port(&survivors, slot) {
                    if port != killed_port {
                        return Some(started.elapsed());
                    }
                }
                std::thread::park_timeout(Duration::from_millis(50));
            }
            None
        })
    };
    // 2 s with the Cluster, then the master is killed; 10 s more.
    let (kill, end) = (200, 1_200);
    let run = load(&servers, end, |tick| {
        if tick == kill {
            cluster.kill(master);
        }
    })
    .await;
    watching.store(false, Ordering::Relaxed);
    let (longest, back_at) = watcher.await.unwrap();
    let promoted = promotion.join().unwrap();
    only_200_and_429(&run.outcomes);
    let killed_at = run.times[kill] - run.times[0];
    let before = run.rate(0, kill);
    let after = run.rate(end - 300, end);
    println!(
        "Cluster failover: killed at {killed_at:?}, replica promoted at {promoted:?}, the \
         last server back at {back_at:?}; longest fallback per server {longest:?}; {before:.0} \
         req/s admitted before, {after:.0} in the last 3 s"
    );
    let promoted = promoted.expect("the Cluster promoted no replica within the run");
    assert!((before - 315.0).abs() <= 0.05 * 315.0, "{before}");
    assert!(
        back_at <= promoted + Duration::from_secs(3),
        "back at {back_at:?}, the replica promoted at {promoted:?}"
    );
    assert!(
        longest.iter().any(|away| !away.is_zero()),
        "the loss was seen"
    );
    assert!((after - 300.0).abs() <= 0.05 * 300.0, "{after}");
    let client = client();
    assert_eq!(
        up_gauges(&client, &servers).await,
        [Some(1.0), Some(1.0), Some(1.0)]
    );
}

/// The calls of `EVALSHA` and `EVAL` a server has run, from `INFO commandstats`.
fn script_calls(server: &RedisServer) -> u64 {
    server
        .info("commandstats")
        .lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| line.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next())
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

/// The local reservation among three servers (`--redis-reservation 10`): under 900 req/s
/// they still share 300 req/s over the run, within 5 %, and no one-second window admits
/// more than the limit's own worst (300 + the burst of 30) plus the stated overshoot of
/// the reservation (3 servers x 10 units), with far fewer round trips than requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_keeps_the_fleet_within_its_stated_overshoot() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let url = redis.url();
    let (servers_count, units) = (3.0, 10.0);
    let servers = fleet(&[
        "--burst",
        "30",
        "--redis-url",
        &url,
        "--redis-budget",
        "250ms",
        "--redis-reservation",
        "10",
    ]);
    let calls = script_calls(&redis);
    let ticks = 400;
    let run = load(&servers, ticks, |_| {}).await;
    let calls = script_calls(&redis) - calls;
    only_200_and_429(&run.outcomes);
    let total = run.admitted(0, ticks);
    let expected = f64::from(LIMIT) * run.seconds(0, ticks) + 30.0;
    // The most any window of one second (100 ticks) admitted, against its bound.
    let (worst, worst_at) = (0..=ticks - 100)
        .map(|from| {
            let per_second =
                f64::from(run.admitted(from, from + 100)) / run.seconds(from, from + 100);
            (per_second, from)
        })
        .fold(
            (0.0, 0),
            |best, next| if next.0 > best.0 { next } else { best },
        );
    let bound = f64::from(LIMIT) + 30.0 + servers_count * units;
    println!(
        "reservation: {total} admitted of {} offered in {:.2} s, expected {expected:.0}; \
         {calls} round trips; busiest second {worst:.0} (from tick {worst_at}), bound {bound:.0}",
        run.outcomes.len(),
        run.seconds(0, ticks)
    );
    let error = (f64::from(total) - expected).abs() / expected;
    assert!(
        error <= 0.05,
        "admitted {total}, expected {expected:.0} (error {:.1} %)",
        error * 100.0
    );
    assert!(
        worst <= bound * 1.05,
        "a second admitted {worst:.0}, bound {bound:.0}"
    );
    // NOTE: under three times the limit the bucket is empty most of the time, so batches
    // are small; the saving comes from the rejections repeated locally and from the
    // requests that wait for the batch under way (0.45 to 0.51 round trips per request
    // measured; a limit nobody reaches takes one per thousand). A batch asked for ahead
    // while the remote's rejection still runs would be rejected again: such asks once
    // made it 0.77 to 0.85.
    let requests = u64::try_from(run.outcomes.len()).unwrap();
    assert!(
        calls * 5 < requests * 4,
        "{calls} round trips for {requests} requests"
    );
    let client = client();
    assert!(
        fallbacks(&client, &servers).await.abs() < f64::EPSILON,
        "no fallback"
    );
}
