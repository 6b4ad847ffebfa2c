//! A reqwest transport for the demo client stack (the `reqwest` feature): the stack's
//! retry layers over a `reqwest::Client` instead of hyper-util's, for the outage
//! experiment's rows through reqwest. The demo's own client ([`http_transport`]) stays
//! reqwest-free.
//!
//! [`http_transport`]: crate::client::http_transport

use backoff_layer::reqwest::Reqwest;

/// A reqwest client as the stack's transport, keeping up to `max_idle` idle connections per
/// host (as [`http_transport`](crate::client::http_transport) does) with `TCP_NODELAY`.
///
/// # Errors
///
/// When reqwest cannot build its client (its TLS backend or the system's resolver fails to
/// initialise).
pub fn reqwest_transport(max_idle: usize) -> Result<Reqwest, reqwest::Error> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(max_idle)
        .tcp_nodelay(true)
        .build()?;
    Ok(Reqwest::new(client))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use http::Request;
    use overload_core::clock::{SystemWallClock, WallClock};
    use tower::ServiceExt;

    use crate::client::{AttemptCounter, CollectLayer, DemoBody};
    use crate::record::Recorder;
    use crate::stack::network_stack;
    use crate::strategy::Strategy;

    /// `full-reqwest` (the `full` layer over reqwest) against a real server failing twice: three attempts on the
    /// wire, numbered, and the success returned; the stack's recorder counts them.
    #[tokio::test]
    async fn full_runs_over_reqwest() {
        let seen = Arc::new(AtomicU32::new(0));
        let count = Arc::clone(&seen);
        let app = Router::new().fallback(move |headers: HeaderMap| {
            let n = count.fetch_add(1, Ordering::SeqCst);
            async move {
                assert_eq!(headers["x-request-attempt"], n.to_string().as_str());
                if n < 2 {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

        let recorder = Recorder::new();
        // `full-reqwest`: the strategy the scenario's runs name for this stack.
        let stack = network_stack(
            Strategy::FullReqwest,
            1,
            Duration::from_secs(2),
            CollectLayer::DEFAULT_MAX_BODY,
            1,
            &(Arc::new(SystemWallClock) as Arc<dyn WallClock>),
            &recorder,
        )
        .unwrap();
        let mut request = Request::get(format!("http://{addr}/api"))
            .body(DemoBody::default())
            .unwrap();
        let attempts = AttemptCounter::new();
        request.extensions_mut().insert(attempts.clone());
        let response = stack.oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        assert_eq!(attempts.get(), 3);
    }
}
