//! The adaptive limit side by side with its anchors, in virtual time: the same model, the
//! same load, one contender at a time.
//!
//! - **Load**: open loop, Poisson arrivals at a fixed rate (as `oha -q` offers a rate),
//!   each request sent once, no retry, no timeout; seeded, so every contender meets the
//!   same arrivals.
//! - **Model**: `demo-server`'s article or M/M/c model, in process, under paused tokio
//!   time; optionally its capacity halved at run time ([`Model::set_capacity`]).
//! - **Contenders**: the bare model; [`AdaptiveLimitLayer`] with its defaults; tower-acc's
//!   `Vegas` and `Gradient2` with theirs.
//!
//! tower-acc's own `ConcurrencyLimit` service measures latency with `std::time::Instant`,
//! which does not follow tokio's paused clock (every latency would read as the microseconds
//! the simulation took to compute), and it waits for a permit rather than rejecting. So its
//! algorithms are driven here through their public `Algorithm` trait by [`AccAdmission`],
//! which does what `tower::load_shed` over tower-acc's `ConcurrencyLimit` does, on virtual
//! time: admit while fewer than `max_concurrency()` are in flight, answer `503` otherwise,
//! and report each completed request's latency and the requests still in flight to
//! `update`, as tower-acc's service does.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use demo_server::model::{LatencyModel, Model, Refused};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use ratelimit_layer::AdaptiveLimitLayer;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_acc::Algorithm;

/// What stands in front of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// Nothing: the bare model.
    None,
    /// This workspace's [`AdaptiveLimitLayer`], defaults (seed fixed).
    Adaptive,
    /// tower-acc's `Vegas::default()`, load-shedding.
    Vegas,
    /// tower-acc's `Gradient2::default()`, load-shedding.
    Gradient2,
}

impl Contender {
    /// Every contender, the bare model first.
    pub const ALL: [Contender; 4] = [Self::None, Self::Adaptive, Self::Vegas, Self::Gradient2];

    /// The name in tables.
    pub const fn name(self) -> &'static str {
        match self {
            Self::None => "none (bare model)",
            Self::Adaptive => "adaptive (this crate)",
            Self::Vegas => "tower-acc Vegas",
            Self::Gradient2 => "tower-acc Gradient2",
        }
    }
}

/// The load and its schedule.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Requests per second, Poisson.
    pub rate: f64,
    /// How long requests are sent.
    pub seconds: u64,
    /// Seconds left out of the figures at the start.
    pub warmup: u64,
    /// When to halve the model's capacity, in seconds from the start, if at all.
    pub halve_at: Option<u64>,
    /// Seed of the arrivals.
    pub seed: u64,
}

/// One request's fate.
#[derive(Clone, Copy, Debug)]
struct Record {
    sent: Duration,
    latency: Duration,
    ok: bool,
}

/// Figures over a span of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    /// Successful responses completed per second.
    pub goodput: f64,
    /// Median latency of the successful responses to requests sent in the span.
    pub p50: Duration,
    /// 99th percentile of the same.
    pub p99: Duration,
    /// Share of the requests sent in the span that were rejected.
    pub rejected: f64,
}

/// What one contender did.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Who.
    pub contender: Contender,
    /// From the end of the warm-up to the halving (or the end).
    pub before: Figures,
    /// From ten seconds after the halving to the end, if the capacity was halved.
    pub after: Option<Figures>,
    /// The limit every 100 ms (empty for the bare model).
    pub limits: Vec<(Duration, usize)>,
}

impl Outcome {
    /// The mean limit over `from..to`.
    pub fn mean_limit(&self, from: Duration, to: Duration) -> f64 {
        let l: Vec<f64> = self
            .limits
            .iter()
            .filter(|(t, _)| (from..to).contains(t))
            .map(|(_, l)| *l as f64)
            .collect();
        if l.is_empty() {
            return 0.0;
        }
        l.iter().sum::<f64>() / l.len() as f64
    }
}

/// tower-acc's algorithm `A` as a load-shedding admission layer on virtual time; see the
/// [module docs](self).
pub struct AccAdmission<A> {
    algorithm: Arc<Mutex<A>>,
    in_flight: Arc<AtomicUsize>,
}

impl<A> Clone for AccAdmission<A> {
    fn clone(&self) -> Self {
        Self {
            algorithm: Arc::clone(&self.algorithm),
            in_flight: Arc::clone(&self.in_flight),
        }
    }
}

impl<A> fmt::Debug for AccAdmission<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccAdmission")
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<A: Algorithm> AccAdmission<A> {
    /// Admission by `algorithm`.
    pub fn new(algorithm: A) -> Self {
        Self {
            algorithm: Arc::new(Mutex::new(algorithm)),
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The algorithm's limit now.
    pub fn limit(&self) -> usize {
        self.algorithm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .max_concurrency()
    }
}

impl<A, S> Layer<S> for AccAdmission<A> {
    type Service = AccService<A, S>;

    fn layer(&self, inner: S) -> Self::Service {
        AccService {
            admission: self.clone(),
            inner,
        }
    }
}

/// The service of [`AccAdmission`].
pub struct AccService<A, S> {
    admission: AccAdmission<A>,
    inner: S,
}

impl<A, S: Clone> Clone for AccService<A, S> {
    fn clone(&self) -> Self {
        Self {
            admission: self.admission.clone(),
            inner: self.inner.clone(),
        }
    }
}

impl<A, S: fmt::Debug> fmt::Debug for AccService<A, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<A, S, B> Service<Request<B>> for AccService<A, S>
where
    A: Algorithm + Send + 'static,
    S: Service<Request<B>, Response = Response<Full<Bytes>>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Full<Bytes>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Full<Bytes>>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let a = &self.admission;
        let limit = a.limit();
        let admitted = a
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            let mut response = Response::new(Full::default());
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            return Box::pin(std::future::ready(Ok(response)));
        }
        let future = self.inner.call(request);
        let admission = a.clone();
        let started = Instant::now();
        Box::pin(async move {
            let result = future.await;
            // As tower-acc's service: the permit is released first, so the in-flight count
            // passed to `update` leaves this request out; an `Err` is an error.
            let in_flight = admission.in_flight.fetch_sub(1, Ordering::AcqRel) - 1;
            admission
                .algorithm
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .update(started.elapsed(), in_flight, result.is_err(), false);
            result
        })
    }
}

/// A deterministic generator of exponential gaps (xorshift64*).
struct Arrivals {
    state: u64,
    mean: f64,
}

impl Arrivals {
    fn next_gap(&mut self) -> Duration {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let x = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        Duration::from_secs_f64(-u.ln() * self.mean)
    }
}

/// Runs `contender` in front of a new `latency` model under `load`, on a new runtime whose
/// time is paused, and returns what it did.
pub fn run(latency: LatencyModel, contender: Contender, load: Load) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(run_paused(latency, contender, load))
}

async fn run_paused(latency: LatencyModel, contender: Contender, load: Load) -> Outcome {
    let model = Model::new(latency);
    let limits = Arc::new(Mutex::new(Vec::new()));
    match contender {
        Contender::None => drive(model.clone(), &model, load, || 0, &limits).await,
        Contender::Adaptive => {
            let layer = AdaptiveLimitLayer::builder()
                .seed(load.seed)
                .build()
                .unwrap();
            let status = layer.clone();
            let limit = move || status.status().limit;
            drive(layer.layer(model.clone()), &model, load, limit, &limits).await
        }
        Contender::Vegas => {
            let layer = AccAdmission::new(tower_acc::Vegas::default());
            let status = layer.clone();
            let limit = move || status.limit();
            drive(layer.layer(model.clone()), &model, load, limit, &limits).await
        }
        Contender::Gradient2 => {
            let layer = AccAdmission::new(tower_acc::Gradient2::default());
            let status = layer.clone();
            let limit = move || status.limit();
            drive(layer.layer(model.clone()), &model, load, limit, &limits).await
        }
    }
    .into_outcome(contender, load, &limits)
}

/// The records of a run.
struct Records(Vec<Record>);

impl Records {
    fn into_outcome(
        self,
        contender: Contender,
        load: Load,
        limits: &Mutex<Vec<(Duration, usize)>>,
    ) -> Outcome {
        let s = Duration::from_secs;
        let end = s(load.seconds);
        let before_end = load.halve_at.map_or(end, s);
        let before = figures(&self.0, s(load.warmup), before_end);
        let after = load
            .halve_at
            .map(|h| figures(&self.0, s(h + 10).min(end), end));
        let limits = if contender == Contender::None {
            Vec::new()
        } else {
            limits.lock().unwrap().clone()
        };
        Outcome {
            contender,
            before,
            after,
            limits,
        }
    }
}

/// Figures of the requests sent in `from..to`, goodput over the same span by completion.
fn figures(records: &[Record], from: Duration, to: Duration) -> Figures {
    let span = (to - from).as_secs_f64();
    let completed_ok = records
        .iter()
        .filter(|r| r.ok && (from..to).contains(&(r.sent + r.latency)))
        .count();
    let sent: Vec<&Record> = records
        .iter()
        .filter(|r| (from..to).contains(&r.sent))
        .collect();
    let mut ok: Vec<Duration> = sent.iter().filter(|r| r.ok).map(|r| r.latency).collect();
    ok.sort_unstable();
    let at = |q: f64| {
        if ok.is_empty() {
            return Duration::ZERO;
        }
        ok[((q * ok.len() as f64).ceil() as usize).clamp(1, ok.len()) - 1]
    };
    let rejected = sent.iter().filter(|r| !r.ok).count();
    Figures {
        goodput: completed_ok as f64 / span,
        p50: at(0.5),
        p99: at(0.99),
        rejected: rejected as f64 / sent.len().max(1) as f64,
    }
}

async fn drive<S>(
    service: S,
    model: &Model,
    load: Load,
    limit: impl Fn() -> usize + Send + 'static,
    limits: &Arc<Mutex<Vec<(Duration, usize)>>>,
) -> Records
where
    S: Service<Request<()>, Response = Response<Full<Bytes>>, Error = Refused>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let start = Instant::now();
    let records = Arc::new(Mutex::new(Vec::new()));
    let sampled = Arc::clone(limits);
    let sampler = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            sampled.lock().unwrap().push((start.elapsed(), limit()));
        }
    });
    let mut arrivals = Arrivals {
        state: load.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        mean: 1.0 / load.rate,
    };
    let end = start + Duration::from_secs(load.seconds);
    let halve_at = load.halve_at.map(|h| start + Duration::from_secs(h));
    let mut halved = false;
    let mut tasks = JoinSet::new();
    let mut next = start;
    loop {
        next += arrivals.next_gap();
        if next >= end {
            break;
        }
        tokio::time::sleep_until(next).await;
        if !halved && halve_at.is_some_and(|h| next >= h) {
            halved = true;
            if let Some(capacity) = model.capacity() {
                let half = std::num::NonZeroUsize::new((capacity.get() / 2).max(1)).unwrap();
                model.set_capacity(half).unwrap();
            }
        }
        let service = service.clone();
        let records = Arc::clone(&records);
        tasks.spawn(async move {
            let sent = Instant::now();
            let result = service.oneshot(Request::new(())).await;
            let ok = matches!(&result, Ok(r) if r.status().is_success());
            records.lock().unwrap().push(Record {
                sent: sent - start,
                latency: sent.elapsed(),
                ok,
            });
        });
        // Keep the set from growing without bound on long runs.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    sampler.abort();
    let records = std::mem::take(&mut *records.lock().unwrap());
    Records(records)
}

/// The unloaded latency of `latency`: p50 and p99 at a tenth of `rate`, bare.
pub fn unloaded(latency: LatencyModel, rate: f64, seed: u64) -> Figures {
    let load = Load {
        rate: rate / 10.0,
        seconds: 30,
        warmup: 1,
        halve_at: None,
        seed,
    };
    run(latency, Contender::None, load).before
}
