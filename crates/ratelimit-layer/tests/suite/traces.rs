//! The server layers' decisions on the request's span (issue 35): a rate limit's
//! rejection, the overload layer's stop signal and the deadline layer's expiry are events
//! of the span the request is served in (here one the test opens around each request, as
//! tower-http's `TraceLayer` does), and the admitted path records none. No client address
//! or key appears in them.
//!
//! Each test installs its subscriber for its own thread (a `current_thread` runtime), so
//! the tests of this binary do not see each other's spans.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use overload_signal::OverloadSignalLayer;
use overload_signal::protocol::{self, Attempt};
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::{AdaptiveLimitLayer, RateLimitLayer, TokenBucket};
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tracing::Instrument;
use tracing::span;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One event: its message, fields and the index of the span it happened in.
#[derive(Clone, Debug)]
struct ServerEvent {
    message: String,
    fields: BTreeMap<String, String>,
    span: Option<usize>,
}

/// A subscriber layer that keeps the names of the spans and every event, in order.
#[derive(Clone, Default)]
struct ServerCapture {
    spans: Arc<Mutex<Vec<&'static str>>>,
    events: Arc<Mutex<Vec<ServerEvent>>>,
}

/// A span's index in [`ServerCapture::spans`], kept in its extensions.
struct SpanIndex(usize);

struct FieldsOf<'a>(&'a mut BTreeMap<String, String>, &'a mut String);

impl tracing::field::Visit for FieldsOf<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.1 = format!("{value:?}");
        } else {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for ServerCapture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut spans = self.spans.lock().unwrap();
        spans.push(attrs.metadata().name());
        let index = SpanIndex(spans.len() - 1);
        ctx.span(id).unwrap().extensions_mut().insert(index);
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let span = ctx
            .event_span(event)
            .map(|s| s.extensions().get::<SpanIndex>().unwrap().0);
        let (mut fields, mut message) = (BTreeMap::new(), String::new());
        event.record(&mut FieldsOf(&mut fields, &mut message));
        self.events.lock().unwrap().push(ServerEvent {
            message,
            fields,
            span,
        });
    }
}

impl ServerCapture {
    fn install() -> (Self, tracing::subscriber::DefaultGuard) {
        let capture = Self::default();
        let guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
        tracing::callsite::rebuild_interest_cache();
        (capture, guard)
    }

    /// The decisions (events with a `decision` field) of span `span`.
    fn decisions_of(&self, span: usize) -> Vec<ServerEvent> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.span == Some(span) && e.fields.contains_key("decision"))
            .cloned()
            .collect()
    }

    fn spans(&self) -> usize {
        self.spans.lock().unwrap().len()
    }
}

type Server = BoxCloneService<Request<()>, Response<()>, Infallible>;

/// A request from a client at 127.0.0.1 (as the axum and tonic adapters put its address; a caller on this host, whose counter the default trust counts),
/// its `X-Request-Attempt` set to `attempt`.
fn request(attempt: u32) -> Request<()> {
    let mut request = Request::new(());
    Attempt::set(request.headers_mut(), attempt);
    request
        .extensions_mut()
        .insert(std::net::SocketAddr::from(([127, 0, 0, 1], 40_000)));
    request
}

/// Serves `request` in a span of its own, as a server's trace layer does; returns the
/// response and the span's index.
async fn serve(
    server: &Server,
    capture: &ServerCapture,
    request: Request<()>,
) -> (Response<()>, usize) {
    let index = capture.spans();
    let span = tracing::info_span!("request");
    let response = server
        .clone()
        .oneshot(request)
        .instrument(span)
        .await
        .unwrap();
    (response, index)
}

fn hello()
-> impl tower::Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(())) })
}

fn assert_private(events: &[ServerEvent]) {
    for event in events {
        for value in event.fields.values().chain([&event.message]) {
            assert!(
                !value.contains("127.0.0.1"),
                "a client address in {event:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_rejection_is_an_event_of_the_requests_span() {
    let (capture, _guard) = ServerCapture::install();
    let limit = RateLimitLayer::builder(TokenBucket::builder(1).burst(1).build().unwrap())
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let server: Server = BoxCloneService::new(ServiceBuilder::new().layer(limit).service(hello()));

    let (admitted, first) = serve(&server, &capture, request(0)).await;
    assert_eq!(admitted.status(), StatusCode::OK);
    assert!(
        capture.decisions_of(first).is_empty(),
        "the admitted path records nothing"
    );

    let (limited, second) = serve(&server, &capture, request(0)).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let decisions = capture.decisions_of(second);
    assert_eq!(decisions.len(), 1, "{decisions:#?}");
    let fields = &decisions[0].fields;
    assert_eq!(fields["decision"], "rate_limited");
    assert_eq!(fields["name"], "default");
    assert_eq!(fields["retry_after_ms"], "1000");
    assert_eq!(fields["key_class"], "global");
    assert_private(&decisions);
}

#[tokio::test(start_paused = true)]
async fn the_overload_layers_stop_signal_is_an_event_of_the_requests_span() {
    let (capture, _guard) = ServerCapture::install();
    let server: Server = BoxCloneService::new(
        ServiceBuilder::new()
            .layer(OverloadSignalLayer::default())
            .layer(
                AdaptiveLimitLayer::builder()
                    .initial_limit(3)
                    .build()
                    .unwrap(),
            )
            .service(service_fn(|_: Request<()>| async {
                // Never answers: the slots stay taken, every other request is rejected.
                std::future::pending::<Result<Response<()>, Infallible>>().await
            })),
    );
    let held: Vec<_> = (0..3)
        .map(|_| tokio::spawn(server.clone().oneshot(request(0))))
        .collect();
    tokio::task::yield_now().await;

    // The first rejections, before the window holds enough requests to judge: passed on.
    let (passed, first) = serve(&server, &capture, request(1)).await;
    assert_eq!(passed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!protocol::is_stop_signal(passed.headers()));
    let decisions = capture.decisions_of(first);
    let kinds: Vec<&str> = decisions
        .iter()
        .map(|e| e.fields["decision"].as_str())
        .collect();
    assert_eq!(kinds, ["at_capacity", "rejection_passed"], "{decisions:#?}");

    // A storm of retries: once the window holds enough of them, the stop signal.
    let mut stopped = None;
    for n in 0..300u32 {
        let (response, span) = serve(&server, &capture, request(1 + n % 3)).await;
        if protocol::is_stop_signal(response.headers()) {
            stopped = Some(span);
            break;
        }
    }
    let stopped = stopped.expect("the retry storm never made the stop signal");
    let decisions = capture.decisions_of(stopped);
    let kinds: Vec<&str> = decisions
        .iter()
        .map(|e| e.fields["decision"].as_str())
        .collect();
    assert_eq!(kinds, ["at_capacity", "stop_signal"], "{decisions:#?}");
    assert_eq!(decisions[1].fields["scope"], "server");
    assert_eq!(decisions[1].fields["status"], "503 Service Unavailable");
    assert_private(&decisions);
    held.iter().for_each(tokio::task::JoinHandle::abort);
}

#[tokio::test(start_paused = true)]
async fn a_request_expired_on_arrival_is_an_event_of_the_requests_span() {
    use overload_signal::{DeadlineLayer, RequestDeadline};
    use tokio::time::{Duration, Instant};

    let (capture, _guard) = ServerCapture::install();
    let server: Server = BoxCloneService::new(
        ServiceBuilder::new()
            .layer(DeadlineLayer::new())
            .service(hello()),
    );
    let mut live = request(0);
    live.extensions_mut()
        .insert(RequestDeadline::after(Duration::from_millis(300)));
    let (served, first) = serve(&server, &capture, live).await;
    assert_eq!(served.status(), StatusCode::OK);
    assert!(
        capture.decisions_of(first).is_empty(),
        "a live request records nothing"
    );

    let mut late = request(0);
    late.extensions_mut()
        .insert(RequestDeadline::at(Instant::now()));
    let (expired, second) = serve(&server, &capture, late).await;
    assert_eq!(expired.status(), StatusCode::GATEWAY_TIMEOUT);
    let decisions = capture.decisions_of(second);
    assert_eq!(decisions.len(), 1, "{decisions:#?}");
    assert_eq!(decisions[0].fields["decision"], "deadline_expired");
    assert_eq!(decisions[0].fields["name"], "default");
    assert!(decisions[0].fields.contains_key("queued_ms"));
    assert_private(&decisions);
}
