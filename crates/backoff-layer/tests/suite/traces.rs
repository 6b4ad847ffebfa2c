//! The retry layer's spans and events (issue 35), captured by a subscriber that records
//! every span (name, fields, parent) and every event (fields, span), under paused time.
//!
//! Each test installs its subscriber for its own thread (a `current_thread` runtime), so
//! the tests of this binary do not see each other's spans.

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use backoff_layer::backoff::{Fixed, Seeds};
use backoff_layer::budget::RetryBudget;
use backoff_layer::throttle::Throttle;
use backoff_layer::{GiveUpReason, RetryBuilder, RetryLayer, is_overloaded, is_throttled};
use support::{MS, Mock, Reply, SECOND, get, info, status};
use tower::{Layer, ServiceExt};
use tracing::span;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One span: its name, fields (recorded at creation and later) and parent's index.
#[derive(Clone, Debug)]
struct CapturedSpan {
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<usize>,
}

/// One event: its message, fields and the index of the span it happened in.
#[derive(Clone, Debug)]
struct CapturedEvent {
    message: String,
    fields: BTreeMap<String, String>,
    span: Option<usize>,
}

/// A subscriber layer that keeps every span and event, in order.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<CapturedSpan>>>,
    events: Arc<Mutex<Vec<CapturedEvent>>>,
}

/// A span's index in [`Capture::spans`], kept in its extensions.
struct Index(usize);

struct Visitor<'a>(&'a mut BTreeMap<String, String>, Option<&'a mut String>);

impl tracing::field::Visit for Visitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match (field.name(), self.1.as_deref_mut()) {
            ("message", Some(message)) => *message = format!("{value:?}"),
            (name, _) => {
                self.0.insert(name.to_owned(), format!("{value:?}"));
            }
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let parent = span
            .parent()
            .map(|p| p.extensions().get::<Index>().unwrap().0);
        let mut fields = BTreeMap::new();
        attrs.record(&mut Visitor(&mut fields, None));
        let mut spans = self.spans.lock().unwrap();
        spans.push(CapturedSpan {
            name: attrs.metadata().name(),
            fields,
            parent,
        });
        span.extensions_mut().insert(Index(spans.len() - 1));
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let i = ctx.span(id).unwrap().extensions().get::<Index>().unwrap().0;
        values.record(&mut Visitor(
            &mut self.spans.lock().unwrap()[i].fields,
            None,
        ));
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let span = ctx
            .event_span(event)
            .map(|s| s.extensions().get::<Index>().unwrap().0);
        let (mut fields, mut message) = (BTreeMap::new(), String::new());
        event.record(&mut Visitor(&mut fields, Some(&mut message)));
        self.events.lock().unwrap().push(CapturedEvent {
            message,
            fields,
            span,
        });
    }
}

impl Capture {
    /// Captures this thread's spans and events while the guard lives.
    fn install() -> (Self, tracing::subscriber::DefaultGuard) {
        let capture = Self::default();
        let subscriber = tracing_subscriber::registry().with(capture.clone());
        let guard = tracing::subscriber::set_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
        (capture, guard)
    }

    fn spans(&self) -> Vec<CapturedSpan> {
        self.spans.lock().unwrap().clone()
    }

    fn events(&self) -> Vec<CapturedEvent> {
        self.events.lock().unwrap().clone()
    }

    /// The index of the only span named `name`.
    fn only(&self, name: &str) -> usize {
        let spans = self.spans();
        let found: Vec<usize> = (0..spans.len())
            .filter(|&i| spans[i].name == name)
            .collect();
        assert_eq!(found.len(), 1, "spans named {name}: {spans:#?}");
        found[0]
    }

    /// The children of span `parent`, in order.
    fn children(&self, parent: usize) -> Vec<CapturedSpan> {
        self.spans()
            .into_iter()
            .filter(|s| s.parent == Some(parent))
            .collect()
    }

    /// The events of span `span` with this message.
    fn events_of(&self, span: usize, message: &str) -> Vec<CapturedEvent> {
        self.events()
            .into_iter()
            .filter(|e| e.span == Some(span) && e.message == message)
            .collect()
    }
}

fn field<'a>(fields: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    fields.get(name).map(String::as_str)
}

fn layer() -> RetryBuilder {
    RetryLayer::builder()
        .backoff(Fixed::every(100 * MS).unwrap())
        .seeds(Seeds::from_seed(1))
}

fn url_get() -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    let mut request = get();
    *request.uri_mut() = "http://api.example:8070/orders?token=secret"
        .parse()
        .unwrap();
    request
}

/// The "done when": a request retried twice then stopped shows one request span
/// with three attempt spans, `http.request.resend_count` absent on the first and 1, 2 on
/// the retries, each attempt's status, the two waits with their cause and duration, and
/// the stop signal.
#[tokio::test(start_paused = true)]
async fn retried_twice_then_stopped_is_one_request_span_with_three_attempts() {
    let (capture, _guard) = Capture::install();
    let mock = Mock::new(vec![
        status(503),
        status(503),
        Reply::Status(503, vec![("x-overloaded", "stop-retrying")]),
    ]);
    let service = layer().max_attempts(5).build().unwrap().layer(mock.clone());
    let err = service.oneshot(url_get()).await.unwrap_err();
    assert!(is_overloaded(&*err), "{err:?}");
    assert_eq!(mock.seen().len(), 3);

    let request = capture.only("retry");
    let spans = capture.spans();
    let fields = &spans[request].fields;
    assert_eq!(field(fields, "otel.kind"), Some("internal"));
    assert_eq!(field(fields, "otel.name"), Some("GET"));
    assert_eq!(field(fields, "http.request.method"), Some("GET"));
    assert_eq!(field(fields, "server.address"), Some("api.example"));
    assert_eq!(field(fields, "server.port"), Some("8070"));
    assert_eq!(
        field(fields, "url.full"),
        Some("http://api.example:8070/orders?token=REDACTED"),
        "query values are redacted"
    );
    assert_eq!(field(fields, "http.response.status_code"), Some("503"));
    assert_eq!(field(fields, "error.type"), Some("503"));
    assert_eq!(field(fields, "retry.attempts"), Some("3"));
    assert_eq!(field(fields, "retry.gave_up"), Some("stop_signal"));

    let attempts = capture.children(request);
    assert_eq!(attempts.len(), 3, "{attempts:#?}");
    for (i, attempt) in attempts.iter().enumerate() {
        assert_eq!(attempt.name, "attempt");
        let f = &attempt.fields;
        assert_eq!(field(f, "otel.kind"), Some("client"));
        assert_eq!(field(f, "otel.name"), Some("GET"));
        assert_eq!(field(f, "server.address"), Some("api.example"));
        assert_eq!(field(f, "http.response.status_code"), Some("503"));
        assert_eq!(field(f, "error.type"), Some("503"));
        let resend = (i > 0).then(|| i.to_string());
        assert_eq!(
            field(f, "http.request.resend_count"),
            resend.as_deref(),
            "attempt {i}"
        );
    }

    let waits = capture.events_of(request, "retry wait");
    assert_eq!(waits.len(), 2, "{:#?}", capture.events());
    for (i, wait) in waits.iter().enumerate() {
        assert_eq!(field(&wait.fields, "cause"), Some("backoff"));
        assert_eq!(field(&wait.fields, "duration_ms"), Some("100"));
        let next = (i + 1).to_string();
        assert_eq!(
            field(&wait.fields, "http.request.resend_count"),
            Some(next.as_str())
        );
    }
    let stops = capture.events_of(request, "stop signal");
    assert_eq!(stops.len(), 1, "{:#?}", capture.events());
    assert_eq!(field(&stops[0].fields, "retry.attempts"), Some("3"));
    assert_eq!(field(&stops[0].fields, "policy"), Some("pass_up"));
    assert!(capture.events_of(request, "gave up").is_empty());
}

/// A success on the first attempt: one attempt span without `resend_count` or
/// `error.type`, and no event of the layer's.
#[tokio::test(start_paused = true)]
async fn a_success_is_one_attempt_and_no_event() {
    let (capture, _guard) = Capture::install();
    let mock = Mock::new(vec![status(200)]);
    let response = layer()
        .build()
        .unwrap()
        .layer(mock)
        .oneshot(url_get())
        .await;
    assert_eq!(info(&response.unwrap()).attempts, 1);
    let request = capture.only("retry");
    let attempts = capture.children(request);
    assert_eq!(attempts.len(), 1);
    let f = &attempts[0].fields;
    assert_eq!(field(f, "http.response.status_code"), Some("200"));
    assert_eq!(field(f, "error.type"), None);
    assert_eq!(field(f, "http.request.resend_count"), None);
    let ours: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.span == Some(request))
        .collect();
    assert!(ours.is_empty(), "{ours:#?}");
}

/// A `Retry-After` longer than the backoff makes the wait, and the event says so.
#[tokio::test(start_paused = true)]
async fn a_retry_after_wait_says_its_cause() {
    let (capture, _guard) = Capture::install();
    let mock = Mock::new(vec![
        Reply::Status(429, vec![("retry-after", "2")]),
        status(200),
    ]);
    let start = tokio::time::Instant::now();
    let service = layer().build().unwrap().layer(mock);
    service.oneshot(url_get()).await.unwrap();
    assert_eq!(start.elapsed(), 2 * SECOND);
    let request = capture.only("retry");
    let waits = capture.events_of(request, "retry wait");
    assert_eq!(waits.len(), 1, "{:#?}", capture.events());
    assert_eq!(field(&waits[0].fields, "cause"), Some("retry_after"));
    assert_eq!(field(&waits[0].fields, "duration_ms"), Some("2000"));
    let attempts = capture.children(request);
    assert_eq!(field(&attempts[0].fields, "error.type"), Some("429"));
    assert_eq!(
        field(&attempts[1].fields, "http.request.resend_count"),
        Some("1")
    );
    assert_eq!(
        field(
            &capture.spans()[request].fields,
            "http.response.status_code"
        ),
        Some("200")
    );
}

/// A gRPC pushback longer than the backoff makes the wait: cause `pushback`; the attempt
/// spans carry the call's `rpc.*` attributes and its status.
#[tokio::test(start_paused = true)]
async fn a_grpc_pushback_wait_says_its_cause() {
    let (capture, _guard) = Capture::install();
    let mock = Mock::new(vec![
        Reply::Status(
            200,
            vec![
                ("content-type", "application/grpc"),
                ("grpc-status", "14"),
                ("grpc-retry-pushback-ms", "700"),
            ],
        ),
        Reply::Status(
            200,
            vec![("content-type", "application/grpc"), ("grpc-status", "0")],
        ),
    ]);
    let request = http::Request::post("http://127.0.0.1:50051/pkg.Greeter/Hello")
        .header("content-type", "application/grpc")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let service = layer().build().unwrap().layer(mock);
    service.oneshot(request).await.unwrap();
    let span = capture.only("retry");
    let waits = capture.events_of(span, "retry wait");
    assert_eq!(waits.len(), 1, "{:#?}", capture.events());
    assert_eq!(field(&waits[0].fields, "cause"), Some("pushback"));
    assert_eq!(field(&waits[0].fields, "duration_ms"), Some("700"));
    let attempts = capture.children(span);
    assert_eq!(attempts.len(), 2);
    let first = &attempts[0].fields;
    assert_eq!(field(first, "otel.name"), Some("pkg.Greeter/Hello"));
    assert_eq!(field(first, "rpc.system"), Some("grpc"));
    assert_eq!(field(first, "rpc.service"), Some("pkg.Greeter"));
    assert_eq!(field(first, "rpc.method"), Some("Hello"));
    assert_eq!(field(first, "rpc.grpc.status_code"), Some("14"));
    assert_eq!(field(first, "error.type"), Some("14"));
    assert_eq!(
        field(&attempts[1].fields, "rpc.grpc.status_code"),
        Some("0")
    );
    assert_eq!(field(&attempts[1].fields, "error.type"), None);
}

/// A spent retry budget: the `budget refused` event, then `gave up` with its reason.
#[tokio::test(start_paused = true)]
async fn a_budget_refusal_is_an_event_then_the_give_up() {
    let (capture, _guard) = Capture::install();
    let budget = RetryBudget::builder()
        .ratio(0.0)
        .min_retries_per_sec(0)
        .build()
        .unwrap();
    let mock = Mock::new(vec![status(503)]);
    let service = layer().budget(budget).build().unwrap().layer(mock.clone());
    let response = service.oneshot(url_get()).await.unwrap();
    assert_eq!(info(&response).gave_up, Some(GiveUpReason::BudgetExhausted));
    assert_eq!(mock.seen().len(), 1);
    let request = capture.only("retry");
    assert_eq!(capture.events_of(request, "budget refused").len(), 1);
    let gave_up = capture.events_of(request, "gave up");
    assert_eq!(gave_up.len(), 1, "{:#?}", capture.events());
    assert_eq!(field(&gave_up[0].fields, "reason"), Some("budget"));
    assert_eq!(field(&gave_up[0].fields, "retry.attempts"), Some("1"));
    let fields = &capture.spans()[request].fields;
    assert_eq!(field(fields, "retry.gave_up"), Some("budget"));
    assert_eq!(field(fields, "http.response.status_code"), Some("503"));
    assert!(capture.events_of(request, "retry wait").is_empty());
}

/// A request the client-side throttle refuses: the request span with the `throttle
/// refused` event, `error.type` `throttled`, and no attempt span (nothing was sent).
#[tokio::test(start_paused = true)]
async fn a_throttle_refusal_is_an_event_and_no_attempt() {
    let (capture, _guard) = Capture::install();
    let throttle = Throttle::builder()
        .min_failures(1)
        .seeds(Seeds::from_seed(35))
        .build()
        .unwrap();
    let mock = Mock::new(vec![status(503)]);
    let service = layer()
        .max_attempts(1)
        .throttle(throttle)
        .build()
        .unwrap()
        .layer(mock.clone());
    // Failures until the throttle refuses (it needs a few to judge), then one more.
    let mut refused = None;
    for _ in 0..200 {
        match service.clone().oneshot(url_get()).await {
            Err(e) if is_throttled(&*e) => {
                refused = Some(e);
                break;
            }
            _ => tokio::time::sleep(10 * MS).await,
        }
    }
    assert!(refused.is_some(), "the throttle never refused");
    let spans = capture.spans();
    let last = spans.iter().rposition(|s| s.name == "retry").unwrap();
    assert_eq!(field(&spans[last].fields, "error.type"), Some("throttled"));
    assert_eq!(field(&spans[last].fields, "retry.attempts"), Some("0"));
    assert!(capture.children(last).is_empty(), "nothing was sent");
    assert_eq!(capture.events_of(last, "throttle refused").len(), 1);
}
