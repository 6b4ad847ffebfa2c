//! Latency models of an overloaded backend, as Tower services.
//!
//! Two models, both runnable in process and under paused tokio time:
//!
//! - [`ArticleModel`] (the default): the article's simulated server, 100 ms up to 30
//!   concurrent requests, then exponentially slower;
//! - [`MmcModel`]: the paper's M/M/10 server, 10 workers with exponential service times of
//!   mean 50 ms and a FIFO queue.
//!
//! A third, [`LatencyModel::Instant`], answers at once, to measure the cost of the layers.
//!
//! A [`Model`] runs one of them. It is a `Service<http::Request<B>>` for any body `B`
//! (the body is not read), answering `200 OK` with the body `ok\n` once the simulated work is
//! done, and a cloneable handle to the model's state: its current
//! [concurrency](Model::concurrency), the [peak](Model::take_peak_concurrency), the
//! [last delay](Model::last_delay), and the [`PauseSwitch`] that freezes it like `SIGSTOP`.
//!
//! # Capacity at run time
//!
//! [`Model::set_capacity`] changes what the model can take while it runs, so that a limit
//! that adapts (or one that does not) can be watched: the article's knee (the concurrency
//! up to which a request takes the base delay) or the M/M/c model's number of workers. A
//! worker removed while busy leaves when it finishes its request.
//!
//! # Concurrency and clients that go away
//!
//! A request counts toward the concurrency from the moment it enters the model (after the
//! backlog of a paused model) until its response future completes **or is dropped**: a guard
//! decrements the count on drop. Whether the future of a request whose client went away is
//! dropped is the server's choice, made where connections are handled
//! ([`server::Abandoned`](crate::server::Abandoned)): the `demo-server` binary serves such
//! requests to the end by default, as the article's server does, so abandoned work keeps
//! counting and slowing the others down; with `--abandoned cancel` hyper drops the future
//! when it sees the connection close, and the request stops counting at once. A client that
//! merely stops reading, without closing, is not seen either way.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use demo_server::model::{LatencyModel, Model};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let model = Model::new(LatencyModel::default());
//! let started = tokio::time::Instant::now();
//! let response = model.clone().oneshot(http::Request::new(())).await.unwrap();
//! assert_eq!(response.status(), 200);
//! assert_eq!(started.elapsed(), Duration::from_millis(100));
//! assert_eq!(model.concurrency(), 0);
//! # }
//! ```

mod article;
mod error;
mod mmc;
mod pause;

pub use article::{ArticleModel, ArticleModelBuilder};
pub use error::InvalidModel;
pub use mmc::{MmcModel, MmcModelBuilder};
pub use pause::{DEFAULT_BACKLOG, PauseSwitch, Refused};

use std::fmt;
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use pause::PauseWatcher;

/// Which latency model a [`Model`] runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LatencyModel {
    /// The article's server; see [`ArticleModel`].
    Article(ArticleModel),
    /// The paper's M/M/c server; see [`MmcModel`].
    Mmc(MmcModel),
    /// No work at all: answers at once. For measuring what the layers in front cost.
    Instant,
}

impl Default for LatencyModel {
    /// The article's model with its defaults.
    fn default() -> Self {
        Self::Article(ArticleModel::default())
    }
}

impl From<ArticleModel> for LatencyModel {
    fn from(m: ArticleModel) -> Self {
        Self::Article(m)
    }
}

impl From<MmcModel> for LatencyModel {
    fn from(m: MmcModel) -> Self {
        Self::Mmc(m)
    }
}

/// A running latency model: a Tower service and a cloneable handle to its state.
///
/// All clones share one model: one concurrency count, one pause switch, one set of workers.
/// See the [module docs](self) for what counts toward the concurrency.
#[derive(Clone)]
pub struct Model {
    shared: Arc<Shared>,
}

struct Shared {
    latency: LatencyModel,
    pause: PauseSwitch,
    /// The `mmc` model's workers, handed out in FIFO order.
    workers: Option<Arc<Semaphore>>,
    concurrency: AtomicUsize,
    peak: AtomicUsize,
    last_delay_nanos: AtomicU64,
    /// Numbers requests as they enter, for the `mmc` model's per-request randomness.
    sequence: AtomicU64,
    /// The capacity in force: the article's knee or the mmc model's workers (0 for
    /// `instant`, which has none).
    capacity: AtomicUsize,
    /// Serialises capacity changes, so that workers are added and removed in order.
    resizing: std::sync::Mutex<()>,
}

impl Model {
    /// A model with a [default](PauseSwitch::default) pause switch (running, backlog 4096).
    pub fn new(latency: LatencyModel) -> Self {
        Self::with_pause_switch(latency, PauseSwitch::default())
    }

    /// A model controlled by `pause`. Keep a clone of the switch to pause and resume it.
    pub fn with_pause_switch(latency: LatencyModel, pause: PauseSwitch) -> Self {
        let workers = match latency {
            LatencyModel::Article(_) | LatencyModel::Instant => None,
            LatencyModel::Mmc(m) => Some(Arc::new(Semaphore::new(m.workers().get()))),
        };
        let capacity = match latency {
            LatencyModel::Article(m) => m.knee(),
            LatencyModel::Mmc(m) => m.workers().get(),
            LatencyModel::Instant => 0,
        };
        Self {
            shared: Arc::new(Shared {
                latency,
                pause,
                workers,
                concurrency: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                last_delay_nanos: AtomicU64::new(0),
                sequence: AtomicU64::new(0),
                capacity: AtomicUsize::new(capacity),
                resizing: std::sync::Mutex::new(()),
            }),
        }
    }

    /// The latency model this runs.
    pub fn latency(&self) -> &LatencyModel {
        &self.shared.latency
    }

    /// The switch that pauses and resumes this model.
    pub fn pause_switch(&self) -> &PauseSwitch {
        &self.shared.pause
    }

    /// How many requests are inside the model now (for `mmc`: queued plus in service).
    /// Requests waiting in a paused model's backlog are not inside yet.
    pub fn concurrency(&self) -> usize {
        self.shared.concurrency.load(Ordering::Relaxed)
    }

    /// The highest concurrency since the last call (or since the model was created), and
    /// starts a new period at the current concurrency. Call it once per reporting interval.
    pub fn take_peak_concurrency(&self) -> usize {
        let now = self.concurrency();
        self.shared.peak.swap(now, Ordering::AcqRel).max(now)
    }

    /// The last delay the model computed: for `article`, the delay from the most recent
    /// re-evaluation (what the article's server prints); for `mmc`, the response time (wait
    /// plus service) of the most recently completed request. Zero before the first.
    pub fn last_delay(&self) -> Duration {
        Duration::from_nanos(self.shared.last_delay_nanos.load(Ordering::Relaxed))
    }

    /// The capacity in force: the `article` model's knee, or the `mmc` model's workers;
    /// `None` for `instant`, which has no capacity to speak of.
    pub fn capacity(&self) -> Option<NonZeroUsize> {
        NonZeroUsize::new(self.shared.capacity.load(Ordering::Relaxed))
    }

    /// Changes the capacity while the model runs: the `article` model's knee (requests
    /// already inside take the new delay at their next re-evaluation), or the `mmc` model's
    /// workers (added at once; removed ones leave as soon as they finish their current
    /// request, ahead of the queue). Returns the capacity before.
    ///
    /// Removing busy `mmc` workers spawns a task that waits for them, so it must be called
    /// inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`NoCapacity`] for the `instant` model.
    pub fn set_capacity(&self, capacity: NonZeroUsize) -> Result<NonZeroUsize, NoCapacity> {
        let shared = &*self.shared;
        if matches!(shared.latency, LatencyModel::Instant) {
            return Err(NoCapacity);
        }
        let _resizing = shared
            .resizing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = shared.capacity.swap(capacity.get(), Ordering::AcqRel);
        if let Some(workers) = &shared.workers {
            let after = capacity.get();
            if after > before {
                workers.add_permits(after - before);
            } else if after < before {
                let remove = before - after;
                let idle = workers.forget_permits(remove);
                if idle < remove {
                    // NOTE: busy workers are taken as they come free, before any queued
                    // request (the semaphore is fair), and never given back.
                    let busy = u32::try_from(remove - idle).unwrap_or(u32::MAX);
                    let workers = Arc::clone(workers);
                    tokio::spawn(async move {
                        if let Ok(permits) = workers.acquire_many(busy).await {
                            permits.forget();
                        }
                    });
                }
            }
        }
        Ok(NonZeroUsize::new(before).unwrap_or(capacity))
    }

    /// Runs one request through the model: waits in the backlog if paused, then for the
    /// simulated work. Returns how long the request spent inside the model, pauses included.
    ///
    /// # Errors
    ///
    /// [`Refused`] when the model is paused and its backlog is full.
    pub async fn serve(&self) -> Result<Duration, Refused> {
        let shared = &*self.shared;
        let mut watcher = shared.pause.watcher();
        shared.pause.admit(&mut watcher).await?;
        let _inside = Inside::enter(shared);
        let entered = Instant::now();
        match shared.latency {
            LatencyModel::Article(m) => article_work(shared, &m, &mut watcher).await,
            LatencyModel::Mmc(m) => {
                let n = shared.sequence.fetch_add(1, Ordering::Relaxed);
                let workers = shared.workers.as_ref().expect("an mmc model has workers");
                // NOTE: the semaphore is never closed, so acquiring cannot fail.
                let _worker = workers.acquire().await.expect("workers are never closed");
                watcher.work(m.service_time(n)).await;
                shared.set_last_delay(entered.elapsed());
            }
            LatencyModel::Instant => {}
        }
        Ok(entered.elapsed())
    }
}

async fn article_work(shared: &Shared, model: &ArticleModel, watcher: &mut PauseWatcher) {
    // The share of this request's work still to do.
    let mut left = 1.0_f64;
    loop {
        watcher.wait_running().await;
        let knee = shared.capacity.load(Ordering::Relaxed);
        let delay = model.delay_with_knee(shared.concurrency.load(Ordering::Relaxed), knee);
        shared.set_last_delay(delay);
        let remaining = delay.mul_f64(left);
        let step = remaining.min(model.tick());
        let done = watcher.work_until_paused(step).await;
        if done == remaining {
            return;
        }
        left -= done.as_secs_f64() / delay.as_secs_f64();
        if left <= 0.0 {
            return;
        }
    }
}

impl Shared {
    fn set_last_delay(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.last_delay_nanos.store(nanos, Ordering::Relaxed);
    }
}

/// The `instant` model has no capacity to change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoCapacity;

impl fmt::Display for NoCapacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the instant model has no capacity to change")
    }
}

impl std::error::Error for NoCapacity {}

/// Counts a request toward the concurrency while it lives.
struct Inside<'a> {
    shared: &'a Shared,
}

impl<'a> Inside<'a> {
    fn enter(shared: &'a Shared) -> Self {
        let now = shared.concurrency.fetch_add(1, Ordering::AcqRel) + 1;
        shared.peak.fetch_max(now, Ordering::AcqRel);
        Self { shared }
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.shared.concurrency.fetch_sub(1, Ordering::AcqRel);
    }
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("latency", &self.shared.latency)
            .field("pause", &self.shared.pause)
            .field("concurrency", &self.concurrency())
            .field("last_delay", &self.last_delay())
            .finish()
    }
}

impl<B> tower_service::Service<http::Request<B>> for Model {
    type Response = http::Response<Full<Bytes>>;
    type Error = Refused;
    type Future = ResponseFuture;

    /// Always ready: a model never applies backpressure; a paused one holds requests in its
    /// backlog instead, like a listen queue.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: http::Request<B>) -> Self::Future {
        let model = self.clone();
        ResponseFuture {
            inner: Box::pin(async move {
                model.serve().await?;
                Ok(http::Response::new(Full::new(Bytes::from_static(b"ok\n"))))
            }),
        }
    }
}

type BoxedResponse =
    Pin<Box<dyn Future<Output = Result<http::Response<Full<Bytes>>, Refused>> + Send>>;

/// The response future of a [`Model`].
///
/// It holds the simulated work in one allocation per request: a model request sleeps for
/// tens of milliseconds at least, so the allocation is immaterial, and a named type keeps the
/// service usable where its future must be named.
pub struct ResponseFuture {
    inner: BoxedResponse,
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<Full<Bytes>>, Refused>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
