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
use std::time::Duration;

use http::{Request, Response, Uri};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{BoxError, ServiceExt};
use tower_service::Service;

use crate::client::{AttemptCounter, DemoBody, Outcome};
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

/// Starts the clients on the current runtime; they run until the returned set is aborted
/// or dropped.
///
/// `service` is the whole client stack; every client sends through its own clone.
pub fn spawn_clients<S>(service: &S, config: &LoadConfig, recorder: &Recorder) -> JoinSet<()>
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
    for index in 0..config.clients.get() {
        let service = service.clone();
        let recorder = recorder.clone();
        let url = config.url.clone();
        // SplitMix-style spreading so that neighbouring indices get unrelated streams.
        let seed = config
            .seed
            .wrapping_add((index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut rng = SmallRng::seed_from_u64(seed);
        set.spawn(async move {
            loop {
                let pause: f64 = think.sample(&mut rng);
                tokio::time::sleep(Duration::from_secs_f64(pause.min(86_400.0))).await;
                recorder.record(Event::Request);
                let mut request = Request::get(url.clone())
                    .body(DemoBody::default())
                    .unwrap_or_else(|_| unreachable!("a GET of a valid Uri is a valid request"));
                request.extensions_mut().insert(AttemptCounter::new());
                let start = Instant::now();
                let result = service.clone().oneshot(request).await;
                match Outcome::of(&result) {
                    Outcome::Ok => recorder.record(Event::Ok {
                        latency: start.elapsed(),
                    }),
                    // NOTE: the stack's `Record` layer counted the timed-out attempt already.
                    Outcome::Timeout => {}
                    Outcome::Error => recorder.record(Event::Error),
                }
            }
        });
    }
    set
}

/// The article-style status line for `seconds` seconds summed in `totals`: OK, errors and
/// timed-out attempts per second, then retries, budget refusals and stop signals per second.
pub fn status_line(totals: &Second, seconds: usize) -> String {
    let per = |n: u64| n as f64 / seconds.max(1) as f64;
    format!(
        "OK {:7.1}/s  errors {:7.1}/s  timed out {:7.1}/s  retries {:7.1}/s  budget refusals {:6.1}/s  stop signals {:6.1}/s",
        per(totals.ok),
        per(totals.errors),
        per(totals.timeouts),
        per(totals.retries),
        per(totals.budget_refusals),
        per(totals.stop_signals),
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
        assert_eq!(total.errors + total.timeouts, 0);
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
        assert!(total.errors > 50, "{total:?}");
        assert_eq!(total.ok, 0);
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
            errors: 5,
            timeouts: 10,
            retries: 20,
            budget_refusals: 1,
            stop_signals: 2,
            ..Second::default()
        };
        let line = status_line(&totals, 5);
        assert!(
            line.starts_with("OK   100.0/s  errors     1.0/s  timed out     2.0/s"),
            "{line}"
        );
        assert!(line.contains("retries     4.0/s"));
    }
}
