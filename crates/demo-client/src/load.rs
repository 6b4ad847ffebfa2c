//! The load generator: N clients, each waiting an exponential think time between requests.
//!
//! This is the article's simulation client: every client sleeps for a think time drawn from
//! an exponential distribution with the configured mean, sends one request through the
//! client stack (which may retry it), records how it ended, and thinks again. With 1000
//! clients and a 10-second mean, the offered load is about 100 requests per second, and it
//! is a closed loop: a client stuck in retries sends no new request.
//!
//! Each client draws its think times from its own generator, seeded from the run's seed and
//! the client's index, so a run is reproducible under a paused clock and no two clients share
//! a sequence.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response, Uri};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{BoxError, ServiceExt};
use tower_service::Service;

use crate::client::{AttemptCounter, DemoBody, Outcome, ThinkTime};
use crate::record::{Event, Recorder, Second};

/// The demo's default number of clients: 1000, from the article's simulation client.
pub const DEFAULT_CLIENTS: usize = 1000;
/// The demo's default mean think time: 10 seconds, from the article's simulation client
/// (1000 clients at one request per 10 s each is about 100 requests per second).
pub const DEFAULT_THINK_TIME: Duration = Duration::from_secs(10);
/// The demo's default per-attempt timeout: 2 seconds, from the article's simulation client.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The demo's default target: the demo server's default address and path.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8070/api";

/// Why a [`LoadConfig`] could not be built.
///
/// The rules: the per-attempt timeout is greater than zero; the think time is greater than zero (an exponential distribution with mean 0
/// does not exist) and at most one day (a longer think time is certainly a typo); the URL has
/// a scheme and an authority, and the scheme is `http`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidLoad(&'static str);

impl InvalidLoad {
    pub(crate) const fn new(reason: &'static str) -> Self {
        Self(reason)
    }
}

impl fmt::Display for InvalidLoad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for InvalidLoad {}

/// What the load generator sends. Build it with [`LoadConfig::new`].
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    clients: NonZeroUsize,
    think_time: Duration,
    url: Uri,
    seed: u64,
}

impl LoadConfig {
    /// `clients` clients, each thinking `think_time` on average between requests to `url`,
    /// with think times drawn from generators seeded by `seed`. See [`InvalidLoad`] for the
    /// rules.
    pub fn new(
        clients: NonZeroUsize,
        think_time: Duration,
        url: Uri,
        seed: u64,
    ) -> Result<Self, InvalidLoad> {
        if think_time.is_zero() {
            return Err(InvalidLoad("the think time must be greater than zero"));
        }
        if think_time > Duration::from_secs(86_400) {
            return Err(InvalidLoad("the think time must be at most one day"));
        }
        if url.scheme_str() != Some("http") || url.authority().is_none() {
            return Err(InvalidLoad(
                "the url must be absolute and use http, like http://127.0.0.1:8070/api",
            ));
        }
        Ok(Self {
            clients,
            think_time,
            url,
            seed,
        })
    }

    /// The number of clients.
    pub fn clients(&self) -> usize {
        self.clients.get()
    }

    /// The mean think time.
    pub fn think_time(&self) -> Duration {
        self.think_time
    }

    /// The target URL.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// The seed of the think-time generators.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The offered load in requests per second when every request succeeds at once.
    pub fn offered_rate(&self) -> f64 {
        self.clients.get() as f64 / self.think_time.as_secs_f64()
    }
}

/// The running clients of [`spawn_clients`]. Dropping it stops them at once; [`stop`](Self::stop)
/// also says which requests were still waiting for an outcome.
#[derive(Debug)]
pub struct Clients {
    set: JoinSet<()>,
    /// Per client: when its request in progress started (nanoseconds since `origin`, plus
    /// one), or 0 while it is thinking.
    started: Arc<[AtomicU64]>,
    origin: Instant,
}

impl Clients {
    /// Stops every client and returns, for each request still in progress at `at` (started
    /// before it, no outcome yet), how long it had been waiting at `at`.
    pub async fn stop(mut self, at: Instant) -> Vec<Duration> {
        self.set.shutdown().await;
        self.started
            .iter()
            .filter_map(|slot| {
                let nanos = slot.load(Ordering::Acquire).checked_sub(1)?;
                let start = self.origin + Duration::from_nanos(nanos);
                (start < at).then(|| at - start)
            })
            .collect()
    }
}

/// Starts the clients on the current runtime; they run until the returned [`Clients`] are
/// stopped or dropped.
///
/// `service` is the whole client stack; every client sends through its own clone. Every
/// request is recorded as [`Event::Request`] when it starts and as [`Event::Ok`] or
/// [`Event::Failed`] when it ends.
pub fn spawn_clients<S>(service: &S, config: &LoadConfig, recorder: &Recorder) -> Clients
where
    S: Service<Request<DemoBody>, Response = Response<DemoBody>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let mut set = JoinSet::new();
    let rate = 1.0 / config.think_time.as_secs_f64();
    // NOTE: `new` rejected a zero or huge think time, so the rate is finite and positive.
    let think = Exp::new(rate).unwrap_or_else(|_| unreachable!("rate checked in LoadConfig"));
    let origin = recorder.start();
    let started: Arc<[AtomicU64]> = (0..config.clients.get())
        .map(|_| AtomicU64::new(0))
        .collect();
    for index in 0..config.clients.get() {
        let service = service.clone();
        let recorder = recorder.clone();
        let url = config.url.clone();
        let started = Arc::clone(&started);
        // SplitMix-style spreading so that neighbouring indices get unrelated streams.
        let seed = config
            .seed
            .wrapping_add((index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut rng = SmallRng::seed_from_u64(seed);
        set.spawn(async move {
            let slot = &started[index];
            loop {
                let pause: f64 = think.sample(&mut rng);
                let pause = Duration::from_secs_f64(pause.min(86_400.0));
                tokio::time::sleep(pause).await;
                recorder.record(Event::Request);
                let mut request = Request::get(url.clone())
                    .body(DemoBody::default())
                    .unwrap_or_else(|_| unreachable!("a GET of a valid Uri is a valid request"));
                request.extensions_mut().insert(AttemptCounter::new());
                request.extensions_mut().insert(ThinkTime(pause));
                let start = Instant::now();
                let since_origin = u64::try_from((start - origin).as_nanos()).unwrap_or(u64::MAX);
                slot.store(since_origin.saturating_add(1), Ordering::Release);
                let result = service.clone().oneshot(request).await;
                let latency = start.elapsed();
                let outcome = Outcome::of(&result);
                if outcome == Outcome::Throttled {
                    recorder.record(Event::Throttled);
                }
                recorder.record(match outcome {
                    Outcome::Ok => Event::Ok { latency },
                    outcome => Event::Failed {
                        latency,
                        timed_out: outcome == Outcome::Timeout,
                    },
                });
                slot.store(0, Ordering::Release);
            }
        });
    }
    Clients {
        set,
        started,
        origin,
    }
}

/// The status line of `demo-client run` for `seconds` seconds summed in `totals`, per
/// second: successful requests, attempts rejected with `429`, stop signals, attempts timed
/// out, requests failed (given up for any reason, budget refusals and local refusals
/// included), requests the client-side throttle refused (never sent), attempts sent.
pub fn status_line(totals: &Second, seconds: usize) -> String {
    let per = |n: u64| n as f64 / seconds.max(1) as f64;
    format!(
        "OK {:6.1}/s  rejected {:6.1}/s  stop signals {:6.1}/s  timed out {:6.1}/s  failed {:6.1}/s  throttled {:6.1}/s  attempts {:6.1}/s",
        per(totals.ok),
        per(totals.rejected),
        per(totals.stop_signals),
        per(totals.timeouts),
        per(totals.failed),
        per(totals.throttled),
        per(totals.attempts),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn config(clients: usize, think: Duration) -> LoadConfig {
        LoadConfig::new(
            NonZeroUsize::new(clients).unwrap(),
            think,
            Uri::from_static("http://127.0.0.1:8070/api"),
            7,
        )
        .unwrap()
    }

    #[test]
    fn config_rules() {
        let n = NonZeroUsize::new(1).unwrap();
        let url = Uri::from_static("http://127.0.0.1:1/");
        assert!(LoadConfig::new(n, Duration::ZERO, url.clone(), 0).is_err());
        assert!(LoadConfig::new(n, Duration::from_secs(86_401), url, 0).is_err());
        let err =
            LoadConfig::new(n, Duration::from_secs(1), Uri::from_static("/api"), 0).unwrap_err();
        assert!(err.to_string().contains("absolute"), "{err}");
        assert!(
            LoadConfig::new(n, Duration::from_secs(1), Uri::from_static("https://x/"), 0).is_err()
        );
        let ok = config(1000, Duration::from_secs(10));
        assert!((ok.offered_rate() - 100.0).abs() < 1e-9);
    }

    #[tokio::test(start_paused = true)]
    async fn clients_offer_the_configured_rate() {
        let recorder = Recorder::new();
        let service = tower::service_fn(|_req: Request<DemoBody>| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, BoxError>(Response::new(DemoBody::default()))
        });
        let set = spawn_clients(&service, &config(200, Duration::from_secs(2)), &recorder);
        tokio::time::sleep(Duration::from_secs(50)).await;
        drop(set);
        let total = recorder.totals(0, 50);
        // 200 clients / 2 s = 100 req/s; over 50 s about 5000 (Poisson, sd about 70).
        assert!((4600..=5400).contains(&total.ok), "{total:?}");
        assert_eq!(total.failed + total.timeouts, 0);
        assert!(total.requests >= total.ok);
        let latency = recorder.snapshot()[10].latencies[0];
        assert_eq!(latency, Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_are_recorded() {
        let recorder = Recorder::new();
        let service = tower::service_fn(|_req: Request<DemoBody>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(500)
                    .body(DemoBody::default())
                    .unwrap(),
            )
        })
        .map_err(BoxError::from);
        let set = spawn_clients(&service, &config(10, Duration::from_secs(1)), &recorder);
        tokio::time::sleep(Duration::from_secs(10)).await;
        drop(set);
        let total = recorder.totals(0, 10);
        assert!(total.failed > 50, "{total:?}");
        assert_eq!(total.errors, total.failed, "none timed out");
        assert_eq!(total.failure_latencies.len() as u64, total.failed);
        assert_eq!(total.ok, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn stop_reports_the_requests_still_waiting() {
        let recorder = Recorder::new();
        // Requests that never end.
        let service = tower::service_fn(|_req: Request<DemoBody>| async {
            std::future::pending::<Result<Response<DemoBody>, BoxError>>().await
        });
        let clients = spawn_clients(&service, &config(20, Duration::from_secs(1)), &recorder);
        tokio::time::sleep(Duration::from_secs(30)).await;
        let waiting = clients.stop(Instant::now()).await;
        // After 30 thinking-time means, every client has a request in progress.
        assert_eq!(waiting.len(), 20);
        assert_eq!(recorder.totals(0, 31).requests, 20);
        assert!(
            waiting.iter().all(|w| *w <= Duration::from_secs(30)),
            "{waiting:?}"
        );
        assert!(
            waiting.iter().any(|w| *w >= Duration::from_secs(25)),
            "{waiting:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn same_seed_same_run() {
        async fn run() -> Vec<u64> {
            let recorder = Recorder::new();
            let service = tower::service_fn(|_req: Request<DemoBody>| async {
                Ok::<_, BoxError>(Response::new(DemoBody::default()))
            });
            let set = spawn_clients(&service, &config(50, Duration::from_secs(1)), &recorder);
            tokio::time::sleep(Duration::from_secs(10)).await;
            drop(set);
            recorder.seconds_until(10).iter().map(|s| s.ok).collect()
        }
        let a = run().await;
        let b = run().await;
        assert_eq!(a, b);
        assert!(a.iter().sum::<u64>() > 0);
    }

    #[test]
    fn status_line_is_per_second() {
        let totals = Second {
            ok: 500,
            rejected: 25,
            stop_signals: 2,
            timeouts: 10,
            failed: 5,
            throttled: 3,
            attempts: 540,
            ..Second::default()
        };
        let line = status_line(&totals, 5);
        assert_eq!(
            line,
            "OK  100.0/s  rejected    5.0/s  stop signals    0.4/s  timed out    2.0/s  failed    1.0/s  throttled    0.6/s  attempts  108.0/s"
        );
    }
}
