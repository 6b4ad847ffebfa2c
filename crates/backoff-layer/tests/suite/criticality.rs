//! The level of criticality on the wire: a handler behind `CriticalityLayer` calls a
//! downstream through the retry layer, and every attempt carries the level its request may
//! claim (the handler's own, or a lower one it asks for; never a higher one), with no code in
//! the handler.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;

use backoff_layer::RetryLayer;
use backoff_layer::backoff::{Fixed, Seeds};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use overload_signal::CriticalityLayer;
use overload_signal::criticality;
use overload_signal::protocol::Criticality::{
    self, Critical, CriticalPlus, Sheddable, SheddablePlus,
};
use overload_signal::protocol::X_REQUEST_CRITICALITY;
use support::{MS, Mock, status};
use tower::{Layer, ServiceExt, service_fn};

/// What the handler does about the level of its downstream call.
#[derive(Clone, Copy, Debug)]
enum Ask {
    /// Nothing: the call carries the handler's level.
    Nothing,
    /// A `Criticality` in the downstream request's extensions.
    Extension(Criticality),
    /// `X-Request-Criticality` written by hand, this value.
    Header(&'static str),
}

/// A downstream answering `503` twice, then `200`: three attempts per call.
fn downstream() -> Mock {
    Mock::new(vec![status(503), status(503), status(200)])
}

/// Serves one request of `level` (in `X-Request-Criticality`, from a trusted peer; `None`:
/// no header) with a handler behind `CriticalityLayer` that calls `mock` through the retry
/// layer as `ask` says. Returns the levels every attempt of the downstream call carried.
async fn levels_downstream(level: Option<&str>, ask: Ask, mock: &Mock) -> Vec<Option<String>> {
    let client = RetryLayer::builder()
        .backoff(Fixed::every(100 * MS).unwrap())
        .seeds(Seeds::from_seed(1))
        .build()
        .unwrap()
        .layer(mock.clone());
    let handler = service_fn(move |_request: Request<()>| {
        let client = client.clone();
        async move {
            let mut call = Request::get("http://downstream/items")
                .body(Empty::<Bytes>::new())
                .unwrap();
            match ask {
                Ask::Nothing => {}
                Ask::Extension(level) => {
                    call.extensions_mut().insert(level);
                }
                Ask::Header(value) => {
                    call.headers_mut()
                        .insert(X_REQUEST_CRITICALITY, value.parse().unwrap());
                }
            }
            let answer = client.oneshot(call).await.unwrap();
            assert_eq!(answer.status(), StatusCode::OK);
            Ok::<_, Infallible>(Response::new(()))
        }
    });
    let server = CriticalityLayer::new().layer(handler);
    let mut request = Request::new(());
    if let Some(level) = level {
        request
            .headers_mut()
            .insert(X_REQUEST_CRITICALITY, level.parse().unwrap());
    }
    // A peer in a private network: trusted by default, so it may claim `critical-plus`.
    request
        .extensions_mut()
        .insert("10.1.2.3:5000".parse::<SocketAddr>().unwrap());
    server.oneshot(request).await.unwrap();
    carried(mock)
}

/// The `X-Request-Criticality` of every attempt `mock` saw (`None`: absent), checking that
/// none carried it twice.
fn carried(mock: &Mock) -> Vec<Option<String>> {
    mock.seen()
        .iter()
        .map(|seen| {
            let values: Vec<_> = seen.headers.get_all(X_REQUEST_CRITICALITY).iter().collect();
            assert!(values.len() <= 1, "{values:?}");
            values.first().map(|v| v.to_str().unwrap().to_owned())
        })
        .collect()
}

fn three(level: Criticality) -> Vec<Option<String>> {
    vec![Some(level.as_str().to_owned()); 3]
}

#[tokio::test(start_paused = true)]
async fn a_downstream_call_carries_its_request_level_on_every_attempt_without_handler_code() {
    for level in Criticality::ALL {
        let mock = downstream();
        let seen = levels_downstream(Some(level.as_str()), Ask::Nothing, &mock).await;
        assert_eq!(seen, three(level), "{level}");
    }
    // A request without a level is served at the server's default, `critical`, and its
    // calls say so.
    let mock = downstream();
    assert_eq!(
        levels_downstream(None, Ask::Nothing, &mock).await,
        three(Critical)
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_asking_for_a_higher_level_sends_its_own() {
    let mock = downstream();
    let seen = levels_downstream(Some("sheddable-plus"), Ask::Extension(CriticalPlus), &mock).await;
    assert_eq!(seen, three(SheddablePlus));
    // The same written by hand in the header: never believed above the request's level.
    let mock = downstream();
    let seen = levels_downstream(Some("sheddable"), Ask::Header("critical-plus"), &mock).await;
    assert_eq!(seen, three(Sheddable));
}

#[tokio::test(start_paused = true)]
async fn a_handler_asking_for_a_lower_level_sends_it_lower() {
    let mock = downstream();
    let seen = levels_downstream(Some("critical-plus"), Ask::Extension(Sheddable), &mock).await;
    assert_eq!(seen, three(Sheddable));
    let mock = downstream();
    let seen = levels_downstream(Some("critical"), Ask::Header("SHEDDABLE_PLUS"), &mock).await;
    assert_eq!(
        seen,
        three(SheddablePlus),
        "parsed, and written in its wire form"
    );
}

#[tokio::test(start_paused = true)]
async fn outside_any_request_a_call_carries_what_it_asks_for_or_nothing() {
    // NOTE: a layer (and so a retry budget) per call: one budget would hold back the lower
    // levels' retries once a higher level had retried.
    let send = |mock: &Mock, ask: Ask| {
        let service = RetryLayer::builder()
            .backoff(Fixed::every(100 * MS).unwrap())
            .seeds(Seeds::from_seed(1))
            .build()
            .unwrap()
            .layer(mock.clone());
        async move {
            let mut call = Request::get("http://downstream/")
                .body(Empty::<Bytes>::new())
                .unwrap();
            match ask {
                Ask::Nothing => {}
                Ask::Extension(level) => {
                    call.extensions_mut().insert(level);
                }
                Ask::Header(value) => {
                    call.headers_mut()
                        .insert(X_REQUEST_CRITICALITY, value.parse().unwrap());
                }
            }
            service.oneshot(call).await.unwrap()
        }
    };
    let mock = downstream();
    send(&mock, Ask::Nothing).await;
    assert_eq!(carried(&mock), vec![None; 3], "no level, no header");
    let mock = downstream();
    send(&mock, Ask::Extension(CriticalPlus)).await;
    assert_eq!(
        carried(&mock),
        three(CriticalPlus),
        "nothing above it to cap it"
    );
    let mock = downstream();
    send(&mock, Ask::Header("urgent")).await;
    assert_eq!(carried(&mock), vec![None; 3], "junk is not sent on");
    // Inside a scope (a task serving a request of that level), the scope caps it.
    let mock = downstream();
    criticality::scope(SheddablePlus, send(&mock, Ask::Extension(CriticalPlus))).await;
    assert_eq!(carried(&mock), three(SheddablePlus));
    let mock = downstream();
    criticality::scope(SheddablePlus, send(&mock, Ask::Header("urgent"))).await;
    assert_eq!(
        carried(&mock),
        three(SheddablePlus),
        "junk replaced by the level"
    );
}

/// A tonic generated client through `for_tonic`: its requests' metadata is the header, and
/// the level is in it on every attempt.
#[cfg(feature = "tonic")]
mod tonic_client {
    use std::sync::{Arc, Mutex};

    use backoff_layer::Retry;
    use backoff_layer::adapter::Tonic;
    use http::HeaderMap;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    use super::*;

    /// A gRPC server answering every call `UNAVAILABLE` (trailers-only, as every gRPC
    /// rejection is), recording each attempt's headers.
    #[derive(Clone, Default)]
    struct Unavailable(Arc<Mutex<Vec<HeaderMap>>>);

    impl tower::Service<Request<tonic::body::Body>> for Unavailable {
        type Response = Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Infallible>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<tonic::body::Body>) -> Self::Future {
            self.0.lock().unwrap().push(request.headers().clone());
            let mut answer = Response::new(tonic::body::Body::empty());
            let headers = answer.headers_mut();
            headers.insert("content-type", "application/grpc".parse().unwrap());
            headers.insert("grpc-status", "14".parse().unwrap());
            std::future::ready(Ok(answer))
        }
    }

    impl Unavailable {
        fn levels(&self) -> Vec<Option<String>> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .map(|h| {
                    h.get(X_REQUEST_CRITICALITY)
                        .map(|v| v.to_str().unwrap().to_owned())
                })
                .collect()
        }

        fn client(&self) -> HealthClient<Retry<Unavailable, Tonic>> {
            let layer = RetryLayer::builder()
                .backoff(Fixed::every(100 * MS).unwrap())
                .seeds(Seeds::from_seed(1))
                .build()
                .unwrap()
                .for_tonic();
            HealthClient::new(layer.layer(self.clone()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_tonic_call_carries_the_level_in_its_metadata_on_every_attempt() {
        let server = Unavailable::default();
        let mut health = server.client();
        // Served at `sheddable-plus`: the call inherits it.
        let status = criticality::scope(SheddablePlus, health.check(HealthCheckRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(server.levels(), three(SheddablePlus));

        // Metadata written by the caller: lower, so kept; never above the scope's level.
        let server = Unavailable::default();
        let mut health = server.client();
        let mut call = tonic::Request::new(HealthCheckRequest::default());
        call.metadata_mut()
            .insert("x-request-criticality", "sheddable".parse().unwrap());
        let _ = criticality::scope(Critical, health.check(call)).await;
        let mut call = tonic::Request::new(HealthCheckRequest::default());
        call.extensions_mut().insert(CriticalPlus);
        let _ = criticality::scope(Critical, health.check(call)).await;
        let mut expected = three(Sheddable);
        expected.extend(three(Critical));
        assert_eq!(server.levels(), expected);
    }
}
