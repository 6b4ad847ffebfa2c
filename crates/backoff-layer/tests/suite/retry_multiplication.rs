//! The paper's retry-multiplication experiment, in virtual time.
//!
//! A server that admits 1000 requests per second and answers the rest with `429` is offered
//! 1100 new requests per second, and its clients retry at once after every rejection. The
//! experiment compares what the server sees without and with a retry budget, with one tier of
//! clients and with three tiers that each retry.
//!
//! # The model
//!
//! - **Arrivals**: new requests arrive as a Poisson process of 1100 per second, from a seeded
//!   generator.
//! - **Server**: a token bucket of 1000 tokens per second holding at most 50 (50 ms of
//!   traffic, so a quiet millisecond's capacity is not lost to Poisson gaps); an attempt that
//!   finds a token is admitted, any other is rejected with
//!   `overload_signal::protocol::too_many_requests_response`. Every answer comes back after a
//!   round trip of 100 ms (the article's server latency), and a rejection's `Retry-After` is
//!   taken off: the paper's clients retry at once, and `RetryLayer` honours a server's hint
//!   as a lower bound on its wait, which would make this a different experiment.
//! - **Clients**: the real [`RetryLayer`], with a backoff that never waits: a rejected attempt
//!   is retried the moment its answer arrives.
//! - **Tiers**: with three tiers, a tier's handler calls the tier below through its own retry
//!   layer and answers with what it got (as a network would carry it: status, headers and
//!   body), so a rejection at the bottom comes back up as a rejection that the tier above
//!   retries in turn.
//!
//! Time is tokio's paused clock, so the four tests' 55 or so virtual seconds take about 6 s of
//! CPU time in a debug build, and every run gives the same figures. Run with `--nocapture` to
//! see them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use backoff_layer::backoff::{Backoff, Seeds};
use backoff_layer::budget::{Budget, RetryBudget, Unlimited};
use backoff_layer::{BoxError, GiveUpReason, ReplayBody, RetryInfo, RetryLayer};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use overload_signal::protocol::{self, Attempt, Protocol};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use rand_distr::{Distribution, Exp};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt, service_fn};

/// New requests per second offered by the top tier.
const OFFERED: f64 = 1100.0;
/// Requests per second the server admits.
const CAPACITY: f64 = 1000.0;
/// Tokens the server's bucket holds at most.
const BURST: f64 = 50.0;
/// The round trip of every attempt.
const RTT: Duration = Duration::from_millis(100);
/// The resolution of the server's counts.
const BUCKET: Duration = Duration::from_millis(100);

type Body = Empty<Bytes>;
/// What a caller sends: the top tier's client, or a tier's client of the tier below.
type Client = BoxCloneService<Request<Body>, Response<Body>, BoxError>;
/// What a retry layer wraps: the hop to the tier (or server) below.
type Hop = BoxCloneService<Request<ReplayBody<Body>>, Response<Body>, BoxError>;

/// Retries the moment a rejection arrives.
#[derive(Debug)]
struct Immediate;

impl Backoff for Immediate {
    fn next_delay(&self, _: u32, _: Option<Duration>, _: &mut dyn RngCore) -> Duration {
        Duration::ZERO
    }

    fn max_delay(&self) -> Duration {
        Duration::ZERO
    }
}

/// Attempts the server saw in one bucket of time.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    /// First attempts (`X-Request-Attempt: 0`).
    first: u64,
    /// Retries (`X-Request-Attempt` of 1 or more).
    retries: u64,
    /// Attempts answered with 429.
    rejected: u64,
}

impl Counts {
    fn total(&self) -> u64 {
        self.first + self.retries
    }

    fn add(&mut self, other: &Counts) {
        self.first += other.first;
        self.retries += other.retries;
        self.rejected += other.rejected;
    }
}

/// The server: a token bucket and the counts of what it saw.
struct Server {
    start: Instant,
    capacity: f64,
    tokens: f64,
    refilled: Instant,
    buckets: Vec<Counts>,
}

impl Server {
    fn new(start: Instant, capacity: f64) -> Self {
        Self {
            start,
            capacity,
            tokens: BURST.min(capacity),
            refilled: start,
            buckets: Vec::new(),
        }
    }

    /// Admits or rejects one attempt now, and counts it.
    fn admit(&mut self, attempt: Attempt) -> bool {
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.capacity).min(BURST);
        self.refilled = now;
        let admitted = self.tokens >= 1.0;
        if admitted {
            self.tokens -= 1.0;
        }
        let i = (now.duration_since(self.start).as_nanos() / BUCKET.as_nanos()) as usize;
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, Counts::default());
        }
        let b = &mut self.buckets[i];
        if attempt.is_retry() {
            b.retries += 1;
        } else {
            b.first += 1;
        }
        if !admitted {
            b.rejected += 1;
        }
        admitted
    }

    /// Counts per `width` of time (a multiple of [`BUCKET`]), over the first `until`.
    fn per(&self, width: Duration, until: Duration) -> Vec<Counts> {
        let k = (width.as_nanos() / BUCKET.as_nanos()) as usize;
        let n = (until.as_nanos() / width.as_nanos()) as usize;
        (0..n)
            .map(|w| {
                let mut c = Counts::default();
                for b in self.buckets.iter().skip(w * k).take(k) {
                    c.add(b);
                }
                c
            })
            .collect()
    }
}

/// The server as the hop a retry layer calls.
fn server(model: Arc<Mutex<Server>>) -> Hop {
    BoxCloneService::new(service_fn(move |request: Request<ReplayBody<Body>>| {
        let admitted = model
            .lock()
            .expect("server model")
            .admit(Attempt::from_request(&request));
        async move {
            tokio::time::sleep(RTT).await;
            let response = if admitted {
                Response::new(Body::new())
            } else {
                let mut rejection =
                    protocol::too_many_requests_response(Protocol::Http, Duration::from_secs(1));
                // NOTE: the paper's clients retry at once; see the module docs.
                rejection.headers_mut().remove(http::header::RETRY_AFTER);
                rejection
            };
            Ok::<_, BoxError>(response)
        }
    }))
}

/// A tier's retry layer: immediate retries, at most `max_attempts` per request.
///
/// Without the client-side throttle: the paper's experiment measures what retries (and a
/// retry budget) do to the load, and its clients send every first attempt. (With the
/// throttle, a tier whose attempts are mostly rejected would refuse most of its first
/// attempts too: another experiment.)
fn retry_layer(max_attempts: u32, budget: Arc<dyn Budget>, seed: u64) -> RetryLayer {
    RetryLayer::builder()
        .max_attempts(max_attempts)
        .backoff(Immediate)
        .shared_budget(budget)
        .no_throttle()
        .seeds(Seeds::from_seed(seed))
        .build()
        .expect("valid retry layer")
}

/// A tier whose handler calls `below` and answers with what it got: the hop the tier above
/// calls.
///
/// The tiers are separate processes in the model, so what crosses the hop is what a network
/// carries: the status, the headers and the body. The response's extensions, the `RetryInfo`
/// of the tier below among them, stay behind.
// NOTE: within one process, a retry layer never retries what a layer below gave up on (its
// `RetryInfo` says so), and nested layers do not multiply at all (`edges.rs`); carrying the
// extensions across this hop would model that, not the paper's tiers.
fn forward(below: Client) -> Hop {
    BoxCloneService::new(service_fn(move |_: Request<ReplayBody<Body>>| {
        let below = below.clone();
        async move {
            let (mut parts, body) = below.oneshot(request()).await?.into_parts();
            parts.extensions = http::Extensions::new();
            Ok(Response::from_parts(parts, body))
        }
    }))
}

fn request() -> Request<Body> {
    Request::get("http://downstream.test/api")
        .body(Body::new())
        .expect("valid request")
}

/// `tiers` tiers of clients, each with its own budget from `budget`, above the server.
fn stack(tiers: u32, max_attempts: u32, budget: impl Fn() -> Arc<dyn Budget>, hop: Hop) -> Client {
    let mut hop = hop;
    let mut tier = tiers;
    loop {
        let client = Client::new(retry_layer(max_attempts, budget(), u64::from(tier)).layer(hop));
        tier -= 1;
        if tier == 0 {
            return client;
        }
        hop = forward(client);
    }
}

/// Offers `OFFERED` new requests per second to `client` for `offered_for`, then waits at
/// most `drain_for` for them to finish; returns how many were sent.
async fn drive(client: Client, offered_for: Duration, drain_for: Duration, seed: u64) -> u64 {
    let mut rng = SmallRng::seed_from_u64(seed);
    let gaps = Exp::new(OFFERED).expect("positive rate");
    let start = Instant::now();
    let mut at = start;
    let mut sent = 0;
    let mut requests = JoinSet::new();
    loop {
        at += Duration::from_secs_f64(gaps.sample(&mut rng));
        if at >= start + offered_for {
            break;
        }
        tokio::time::sleep_until(at).await;
        let client = client.clone();
        requests.spawn(async move { client.oneshot(request()).await });
        sent += 1;
    }
    let _ = tokio::time::timeout(drain_for, async {
        while let Some(done) = requests.join_next().await {
            let response = done
                .expect("request task")
                .expect("no transport errors here");
            assert!(
                response.status() == StatusCode::OK
                    || response.status() == StatusCode::TOO_MANY_REQUESTS
            );
        }
    })
    .await;
    // Requests still retrying (only without a bound on attempts) are dropped here.
    requests.abort_all();
    sent
}

fn unlimited() -> Arc<dyn Budget> {
    Arc::new(Unlimited)
}

fn default_budget() -> Arc<dyn Budget> {
    Arc::new(RetryBudget::default())
}

fn print_rows(title: &str, rows: &[Counts], width: Duration) {
    println!("\n{title}");
    println!(
        "{:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "t (s)", "load/s", "first/s", "retries/s", "rejected/s", "rejected"
    );
    let per_sec = 1.0 / width.as_secs_f64();
    for (i, c) in rows.iter().enumerate() {
        println!(
            "{:>8.1} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>9.1}%",
            (i + 1) as f64 * width.as_secs_f64(),
            c.total() as f64 * per_sec,
            c.first as f64 * per_sec,
            c.retries as f64 * per_sec,
            c.rejected as f64 * per_sec,
            share(c.rejected, c.total()) * 100.0,
        );
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn sum(rows: &[Counts]) -> Counts {
    let mut c = Counts::default();
    for r in rows {
        c.add(r);
    }
    c
}

/// One tier, no budget, no bound on attempts: once the token bucket's burst is spent, the
/// load climbs by the 100 req/s of excess every round trip (each pending request comes back
/// once per round trip, and 100 more become pending each second), so it passes 2000 req/s,
/// and 50% rejections, 9 round trips after the first rejection, and keeps climbing.
#[tokio::test(start_paused = true)]
async fn one_tier_without_budget_climbs_past_2000_per_second() {
    let start = Instant::now();
    let model = Arc::new(Mutex::new(Server::new(start, CAPACITY)));
    let client = stack(1, u32::MAX, unlimited, server(Arc::clone(&model)));
    let run = Duration::from_secs(3);
    drive(client, run, Duration::ZERO, 1).await;

    let model = model.lock().unwrap();
    let rows = model.per(BUCKET, run);
    print_rows(
        "one tier, no budget, unbounded immediate retries (per 100 ms)",
        &rows,
        BUCKET,
    );
    let per_sec = |c: &Counts| c.total() as f64 / BUCKET.as_secs_f64();
    let first_rejection = rows
        .iter()
        .position(|c| c.rejected > 0)
        .expect("the server rejects");
    // The first 100 ms bucket at which the server sees 2000 req/s, half of them rejected.
    let crossed = rows
        .iter()
        .position(|c| per_sec(c) >= 2000.0 && c.rejected * 2 >= c.total())
        .expect("the load reaches 2000 req/s");
    let (t0, t1) = (
        first_rejection as f64 * BUCKET.as_secs_f64(),
        (crossed + 1) as f64 * BUCKET.as_secs_f64(),
    );
    let tail = &rows[rows.len() - 5..];
    let end_load = tail.iter().map(per_sec).sum::<f64>() / tail.len() as f64;
    let rounds = (run.as_secs_f64() - 0.25 - t0) / RTT.as_secs_f64();
    let slope = (end_load - OFFERED) / rounds;
    println!(
        "first rejection at {t0:.1} s; 2000 req/s and 50% rejected at {t1:.1} s, {:.1} s later \
         (model: 9 round trips of {} ms = {:.1} s; paper: 4.2 s); \
         load {end_load:.0} req/s at {:.1} s: +{slope:.0} req/s per round trip (model: +100)",
        t1 - t0,
        RTT.as_millis(),
        9.0 * RTT.as_secs_f64(),
        run.as_secs_f64(),
    );
    // 9 round trips of 100 ms, give or take the Poisson noise.
    assert!(
        (0.6..=1.3).contains(&(t1 - t0)),
        "crossed {} s after",
        t1 - t0
    );
    // And it does not stop there: nothing bounds it.
    assert!((60.0..=140.0).contains(&slope), "slope {slope}");
    assert!(end_load >= 2500.0, "{end_load}");
}

/// One tier, the default budget: retries stay within 10% of first attempts plus the floor,
/// in every window, whatever the demand for retries.
#[tokio::test(start_paused = true)]
async fn one_tier_with_budget_stays_within_ten_percent() {
    let start = Instant::now();
    let model = Arc::new(Mutex::new(Server::new(start, CAPACITY)));
    // Built at `start`, so its slots line up with the server's one-second rows.
    let client = stack(1, u32::MAX, default_budget, server(Arc::clone(&model)));
    let run = Duration::from_secs(20);
    drive(client, run, Duration::ZERO, 2).await;

    let model = model.lock().unwrap();
    let seconds = model.per(Duration::from_secs(1), run);
    print_rows(
        "one tier, default budget (10% + 1/s over 10 s), unbounded immediate retries (per second)",
        &seconds,
        Duration::from_secs(1),
    );
    // The budget's invariant, seen by the server: in every window of 10 one-second slots,
    // retries <= 0.1 * first attempts + 10.
    for end in 0..seconds.len() {
        let w = sum(&seconds[end.saturating_sub(9)..=end]);
        assert!(
            w.retries * 10 <= w.first + 100,
            "window ending at {end} s: {w:?}"
        );
    }
    let steady = sum(&seconds[10..]);
    let ratio = steady.total() as f64 / steady.first as f64;
    let rejected = share(steady.rejected, steady.total());
    println!(
        "steady state (10-20 s): load {:.0} req/s = {ratio:.3}x first attempts, {:.1}% rejected ({:.0} req/s)",
        steady.total() as f64 / 10.0,
        rejected * 100.0,
        steady.rejected as f64 / 10.0,
    );
    // At or below 1.1x offered, plus the floor of 1 retry per second.
    let bound = 1.1 + 1.0 / (steady.first as f64 / 10.0);
    assert!(ratio <= bound, "{ratio} > {bound}");
    // The budget is used: demand for retries is far above it.
    assert!(ratio >= 1.09, "{ratio}");
    // Rejections: the 100 req/s of excess first attempts, plus the retries the budget let
    // through, which find the server just as full.
    assert!(
        (0.15..=0.19).contains(&rejected),
        "rejected share {rejected}"
    );
}

/// Three tiers, 3 attempts each, no budget. Against a server that rejects everything, every
/// request becomes exactly 3^3 = 27 attempts at the bottom; against the 1000 req/s server,
/// the multiplication settles where the bottom admits 1000 req/s.
#[tokio::test(start_paused = true)]
async fn three_tiers_without_budget_multiply_up_to_27_times() {
    // Hard down: the bound itself.
    let start = Instant::now();
    let model = Arc::new(Mutex::new(Server::new(start, 0.0)));
    let client = stack(3, 3, unlimited, server(Arc::clone(&model)));
    let sent = drive(client, Duration::from_secs(1), Duration::from_secs(10), 3).await;
    let total = sum(&model.lock().unwrap().buckets);
    println!(
        "\nthree tiers, no budget, server down: {sent} requests -> {} attempts at the bottom ({:.2}x)",
        total.total(),
        total.total() as f64 / sent as f64
    );
    assert_eq!(total.total(), 27 * sent);
    assert_eq!(total.rejected, total.total());

    // The 1000 req/s server.
    let start = Instant::now();
    let model = Arc::new(Mutex::new(Server::new(start, CAPACITY)));
    let client = stack(3, 3, unlimited, server(Arc::clone(&model)));
    // A request's 27 attempts take 27 round trips (2.7 s), and the requests still retrying
    // pile up for several times that: the load is still climbing at the end of the run.
    let run = Duration::from_secs(8);
    let sent = drive(client, run, Duration::ZERO, 4).await;
    let model = model.lock().unwrap();
    let seconds = model.per(Duration::from_secs(1), run);
    print_rows(
        "three tiers, 3 attempts each, no budget (per second)",
        &seconds,
        Duration::from_secs(1),
    );
    let last = seconds.last().unwrap();
    let multiplication = last.total() as f64 / OFFERED;
    let rejected = share(last.rejected, last.total());
    println!(
        "last second: {} req/s at the bottom = {multiplication:.2}x offered, {:.1}% rejected, \
         still climbing ({sent} requests sent)",
        last.total(),
        rejected * 100.0
    );
    // With independent rejections, the load would settle where admitted 1100 * (1 - p^27)
    // = 1000: p = 0.915, 11,800 req/s, 10.7x. Here the retries of one round trip arrive
    // in waves that a 50-token bucket cannot absorb, so rejections are more likely than
    // that and the load climbs further, towards the 27x ceiling.
    assert!(
        (6.0..=27.0).contains(&multiplication),
        "multiplication {multiplication}"
    );
    assert!(rejected >= 0.8, "rejected share {rejected}");
}

/// Three tiers, 3 attempts each, the default budget at every tier: each tier adds at most
/// 10% (plus its floor), so the bottom sees about 1.1^3 = 1.331x the offered load.
#[tokio::test(start_paused = true)]
async fn three_tiers_with_budget_stay_near_1_1_cubed() {
    let start = Instant::now();
    let model = Arc::new(Mutex::new(Server::new(start, CAPACITY)));
    let client = stack(3, 3, default_budget, server(Arc::clone(&model)));
    let run = Duration::from_secs(20);
    let sent = drive(client, run, Duration::from_secs(1), 5).await;
    let model = model.lock().unwrap();
    let seconds = model.per(Duration::from_secs(1), run);
    print_rows(
        "three tiers, 3 attempts each, default budget at every tier (per second)",
        &seconds,
        Duration::from_secs(1),
    );
    let all = sum(&model.buckets);
    // The run (20 s of arrivals, 1 s to finish) spans 3 windows of the budgets, which were
    // built with the server's clock at `start`: in each, a tier's retries are at most 0.1 *
    // its first attempts + 10 (the floor), so over the run at most 0.1 * first attempts + 30.
    // The first attempts of a tier are the attempts of the tier above.
    let mut bound = sent as f64;
    for _ in 0..3 {
        bound = bound * 1.1 + 30.0;
    }
    let multiplication = all.total() as f64 / sent as f64;
    println!(
        "whole run: {sent} requests -> {} attempts at the bottom = {multiplication:.3}x (1.1^3 = 1.331; bound with floors {:.0})",
        all.total(),
        bound
    );
    assert!(all.total() as f64 <= bound, "{} > {bound}", all.total());
    let steady = sum(&seconds[10..]);
    let steady_multiplication = steady.total() as f64 / (OFFERED * 10.0);
    println!(
        "steady state (10-20 s): {:.0} req/s at the bottom = {steady_multiplication:.3}x offered, {:.1}% rejected",
        steady.total() as f64 / 10.0,
        share(steady.rejected, steady.total()) * 100.0
    );
    assert!(
        (1.2..=1.36).contains(&steady_multiplication),
        "multiplication {steady_multiplication}"
    );
}

/// The retry layer's default budget is `RetryBudget::default()`: against a server that is
/// down, a lone request with no limit on attempts gets the floor's 10 retries, and then a
/// typed give-up.
#[tokio::test(start_paused = true)]
async fn the_layer_budgets_retries_by_default() {
    let model = Arc::new(Mutex::new(Server::new(Instant::now(), 0.0)));
    let layer = RetryLayer::builder()
        .max_attempts(u32::MAX)
        .backoff(Immediate)
        .no_throttle()
        .seeds(Seeds::from_seed(6))
        .build()
        .expect("valid retry layer");
    let response = layer
        .layer(server(Arc::clone(&model)))
        .oneshot(request())
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let info = response
        .extensions()
        .get::<RetryInfo>()
        .expect("retry info");
    assert_eq!(info.attempts, 11);
    assert_eq!(info.gave_up, Some(GiveUpReason::BudgetExhausted));
    assert_eq!(sum(&model.lock().unwrap().buckets).total(), 11);
}
