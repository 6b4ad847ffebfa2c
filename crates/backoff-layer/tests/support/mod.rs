//! A scripted mock inner service that records what every attempt carried; what the layer
//! logs and records, captured.

#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use backoff_layer::{BoxError, ReplayBody};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty, StreamBody};
use overload_signal::protocol::Attempt;
use tokio::time::Instant;
use tower_service::Service;

/// What the mock does for one attempt.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Answers with this status and headers.
    Status(u16, Vec<(&'static str, &'static str)>),
    /// Fails with an `std::io::Error` of this kind.
    Io(std::io::ErrorKind),
    /// Never answers.
    Hang,
    /// Answers with this status after this long.
    Late(Duration, u16),
}

pub fn status(code: u16) -> Reply {
    Reply::Status(code, Vec::new())
}

/// What one attempt carried.
#[derive(Clone, Debug)]
pub struct Seen {
    pub attempt: Attempt,
    pub method: Method,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
    pub at: Instant,
}

#[derive(Clone)]
pub struct Mock {
    script: Arc<[Reply]>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Mock {
    /// Replies in order; the last reply repeats.
    pub fn new(script: Vec<Reply>) -> Self {
        assert!(!script.is_empty());
        Self {
            script: script.into(),
            seen: Arc::default(),
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn attempts(&self) -> Vec<Attempt> {
        self.seen().iter().map(|s| s.attempt).collect()
    }
}

impl<B> Service<Request<ReplayBody<B>>> for Mock
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<Empty<Bytes>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReplayBody<B>>) -> Self::Future {
        let seen = Arc::clone(&self.seen);
        let script = Arc::clone(&self.script);
        Box::pin(async move {
            let at = Instant::now();
            let (parts, body) = request.into_parts();
            let collected = body.collect().await.expect("request body");
            let trailers = collected.trailers().cloned();
            let body = collected.to_bytes();
            let n = {
                let mut seen = seen.lock().unwrap();
                seen.push(Seen {
                    attempt: Attempt::from_headers(&parts.headers),
                    method: parts.method,
                    headers: parts.headers,
                    body,
                    trailers,
                    at,
                });
                seen.len() - 1
            };
            match script[n.min(script.len() - 1)].clone() {
                Reply::Status(code, headers) => {
                    let mut r = Response::new(Empty::new());
                    *r.status_mut() = StatusCode::from_u16(code).unwrap();
                    for (k, v) in headers {
                        r.headers_mut().append(k, v.parse().unwrap());
                    }
                    Ok(r)
                }
                Reply::Io(kind) => Err(std::io::Error::from(kind)),
                Reply::Hang => std::future::pending().await,
                Reply::Late(after, code) => {
                    tokio::time::sleep(after).await;
                    let mut r = Response::new(Empty::new());
                    *r.status_mut() = StatusCode::from_u16(code).unwrap();
                    Ok(r)
                }
            }
        })
    }
}

/// A body streamed from a list of frames, with no size hint.
pub type Streamed =
    StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A body of `chunks` frames of `size` bytes each, with distinct contents, and no size hint.
pub fn streamed(chunks: usize, size: usize) -> Streamed {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..chunks)
        .map(|i| {
            let data: Vec<u8> = (0..size).map(|j| ((i * 31 + j * 7) % 251) as u8).collect();
            Ok(Frame::data(Bytes::from(data)))
        })
        .collect();
    StreamBody::new(futures_util::stream::iter(frames))
}

pub fn expected_bytes(chunks: usize, size: usize) -> Vec<u8> {
    (0..chunks)
        .flat_map(|i| (0..size).map(move |j| ((i * 31 + j * 7) % 251) as u8))
        .collect()
}

pub const SECOND: Duration = Duration::from_secs(1);
pub const MS: Duration = Duration::from_millis(1);

/// A `GET` of `http://example.test/` without a body.
pub fn get() -> Request<Empty<Bytes>> {
    Request::get("http://example.test/")
        .body(Empty::new())
        .unwrap()
}

/// The `RetryInfo` the layer puts on every response.
pub fn info(r: &Response<Empty<Bytes>>) -> backoff_layer::RetryInfo {
    *r.extensions()
        .get::<backoff_layer::RetryInfo>()
        .expect("RetryInfo on every response")
}

/// The `GaveUp` an error must be.
pub fn gave_up(e: &BoxError) -> &backoff_layer::GaveUp {
    e.downcast_ref::<backoff_layer::GaveUp>()
        .unwrap_or_else(|| panic!("expected GaveUp, got {e:?}"))
}

/// One event the layer logged: its level, message and fields (`name`, `lasted_ms`, ...).
#[derive(Clone, Debug)]
pub struct Logged {
    pub level: tracing::Level,
    pub message: String,
    pub fields: std::collections::BTreeMap<String, String>,
}

/// The events logged on this thread (a `current_thread` test's, tasks included) while the
/// guard [`Logs::capture`] returns lives; and the spans opened, with their fields.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<Logged>>>, Arc<Mutex<Vec<Logged>>>);

impl Logs {
    pub fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        use tracing_subscriber::layer::SubscriberExt;

        anchor_interest();
        let logs = Self::default();
        let guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
        tracing::callsite::rebuild_interest_cache();
        (logs, guard)
    }

    /// The events at `level` (`WARN`, `INFO`, ...), in order.
    pub fn at(&self, level: tracing::Level) -> Vec<Logged> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|e| e.level == level)
            .cloned()
            .collect()
    }

    /// Every event, at every level, and every span opened (its name as the message), in
    /// order: all a subscriber could print.
    pub fn everything(&self) -> Vec<Logged> {
        let mut all = self.0.lock().unwrap().clone();
        all.extend(self.1.lock().unwrap().iter().cloned());
        all
    }
}

/// Reads an event's or a span's fields into a [`Logged`].
struct Fields<'a>(&'a mut Logged);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0
            .fields
            .insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let value = format!("{value:?}");
        if field.name() == "message" {
            self.0.message = value;
        } else {
            self.0.fields.insert(field.name().to_owned(), value);
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Logs {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut logged = Logged {
            level: *attrs.metadata().level(),
            message: attrs.metadata().name().to_owned(),
            fields: std::collections::BTreeMap::new(),
        };
        attrs.record(&mut Fields(&mut logged));
        self.1.lock().unwrap().push(logged);
    }

    fn on_record(
        &self,
        _: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut logged = Logged {
            level: tracing::Level::TRACE,
            message: "(span record)".to_owned(),
            fields: std::collections::BTreeMap::new(),
        };
        values.record(&mut Fields(&mut logged));
        self.1.lock().unwrap().push(logged);
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut logged = Logged {
            level: *event.metadata().level(),
            message: String::new(),
            fields: std::collections::BTreeMap::new(),
        };
        event.record(&mut Fields(&mut logged));
        self.0.lock().unwrap().push(logged);
    }
}

/// The counters and histograms recorded on this thread while the guard lives, as
/// `name{label=value}...` (labels in the order the metric was registered with).
pub struct Recorded {
    snapshotter: metrics_util::debugging::Snapshotter,
    _guard: metrics::LocalRecorderGuard<'static>,
}

impl Recorded {
    /// Installs a recorder for this thread; the layers built before it are fine, as long as
    /// they have not served a request yet.
    pub fn install() -> Self {
        let recorder: &'static _ =
            Box::leak(Box::new(metrics_util::debugging::DebuggingRecorder::new()));
        Self {
            snapshotter: recorder.snapshotter(),
            _guard: metrics::set_default_local_recorder(recorder),
        }
    }

    /// Every series (of any kind), as `name{label=value}...`.
    pub fn series(&self) -> Vec<String> {
        self.snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, ..)| {
                let key = key.key();
                let mut name = key.name().to_owned();
                for label in key.labels() {
                    name.push_str(&format!("{{{}={}}}", label.key(), label.value()));
                }
                name
            })
            .collect()
    }

    /// Every counter's value, and every histogram's number of values.
    pub fn snapshot(&self) -> std::collections::BTreeMap<String, u64> {
        use metrics_util::debugging::DebugValue;

        let mut out = std::collections::BTreeMap::new();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut name = key.name().to_owned();
            for label in key.labels() {
                name.push_str(&format!("{{{}={}}}", label.key(), label.value()));
            }
            let value = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(values) => values.len() as u64,
                DebugValue::Gauge(_) => panic!("no gauges expected: {name}"),
            };
            out.insert(name, value);
        }
        out
    }

    /// Every counter's value, whatever else was recorded (a throttle's gauges).
    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        use metrics_util::debugging::DebugValue;

        let mut out = std::collections::BTreeMap::new();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            if let DebugValue::Counter(n) = value {
                let key = key.key();
                let mut name = key.name().to_owned();
                for label in key.labels() {
                    name.push_str(&format!("{{{}={}}}", label.key(), label.value()));
                }
                out.insert(name, n);
            }
        }
        out
    }
}

/// Keeps tracing's per-callsite interest right while tests run in parallel: the interest is
/// cached process-wide, computed on the thread that reaches a callsite first, and with one
/// dispatcher alive a sibling test's thread (no subscriber) would cache "never", so a
/// capturing test would miss the event. A global subscriber interested in every callsite and
/// enabling none keeps two dispatchers alive, so the interest is the union.
fn anchor_interest() {
    use tracing_subscriber::layer::SubscriberExt;

    struct Anchor;
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Anchor {
        fn register_callsite(
            &self,
            _: &'static tracing::Metadata<'static>,
        ) -> tracing::subscriber::Interest {
            tracing::subscriber::Interest::sometimes()
        }
        fn enabled(
            &self,
            _: &tracing::Metadata<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) -> bool {
            false
        }
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // NOTE: another global subscriber already installed serves as well.
        let _ =
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Anchor));
    });
}
