//! A [`reqwest::Client`] behind the retry layer (the `reqwest` and
//! `reqwest-middleware` features).
//!
//! Two forms, one stack: backoff with jitter, the retry budget, the client-side throttle,
//! `X-Request-Attempt`, `X-Request-Deadline` on the wire, `Retry-After` honoured up to
//! [`max_retry_after`](crate::RetryBuilder::max_retry_after), the stop signal, and body
//! replay, exactly as the [crate docs](crate) list them for any other client:
//!
//! - `RetryMiddleware` (the `reqwest-middleware` feature): a
//!   `reqwest_middleware::Middleware`, for a `ClientWithMiddleware`, which is how
//!   `reqwest-retry`'s users compose; requests are made as with reqwest itself
//!   (`client.get(url).send()`). The fewest lines:
//!
//! ```no_run
//! # #[cfg(feature = "reqwest-middleware")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use backoff_layer::reqwest::RetryMiddleware;
//!
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new())
//!     .build();
//! let text = client.get("http://127.0.0.1:8070/api").send().await?.text().await?;
//! # let _ = text;
//! # Ok(())
//! # }
//! ```
//!
//! - [`Reqwest`] (the `reqwest` feature): a `reqwest::Client` as a Tower service of
//!   `http::Request<B>` to `http::Response<reqwest::Body>`, so [`RetryLayer`](crate::RetryLayer)
//!   wraps it with nothing changed, in a `ServiceBuilder` with any other Tower layer, with
//!   no dependency on `reqwest-middleware`.
//!
//! # Example
//!
//! The Tower form, with every default of the layer (see the [crate docs](crate#defaults)):
//!
//! ```no_run
//! # async fn run() -> Result<(), backoff_layer::BoxError> {
//! use backoff_layer::{RetryLayer, reqwest::Reqwest};
//! use tower::{Layer, ServiceExt};
//!
//! let client = RetryLayer::new().layer(Reqwest::new(reqwest::Client::new()));
//! let request = http::Request::get("http://127.0.0.1:8070/api").body(reqwest::Body::from(""))?;
//! let response = reqwest::Response::from(client.clone().oneshot(request).await?);
//! println!("{}", response.text().await?);
//! # Ok(())
//! # }
//! ```
//!
//! `client` is `Clone` (a `reqwest::Client` is an `Arc` inside, the layer's state too):
//! clone it per request or per task, as `oneshot` above does. A response converts into a
//! `reqwest::Response` (`reqwest::Response::from`) for `text()`, `json()` and the rest;
//! its extensions carry the layer's [`RetryInfo`](crate::RetryInfo), with either form.
//!
//! # Body replay, streams included
//!
//! reqwest's own retry (0.13's `retry` policy) and `reqwest-retry` need a body they can
//! clone (`reqwest::Body::try_clone`), which a streaming body (`reqwest::Body::wrap_stream`,
//! `Body::wrap`) is not: reqwest sends such a request once and never retries it, and
//! `reqwest-retry` (0.9) fails it before sending anything ("Request object is not
//! cloneable"). Under the retry layer, a body of any kind, a stream included, is kept as it
//! streams, up to the layer's [`body_limit`](crate::RetryBuilder::body_limit) (64 KiB by
//! default), and sent again byte for byte; a larger body is sent once and never retried
//! ([`GiveUpReason::BodyNotReplayable`](crate::GiveUpReason::BodyNotReplayable)).
//!
//! # Errors
//!
//! The service's error is reqwest's own [`reqwest::Error`]; the layer retries its connect
//! errors and timeouts (`is_connect()`, `is_timeout()`: see
//! [`classify::is_connect_error`](crate::classify::is_connect_error) and
//! [`classify::is_timeout`](crate::classify::is_timeout)), and returns the
//! [outcomes](crate#outcomes) the crate docs list, boxed. A request whose URI is not an
//! absolute URL reqwest accepts fails at once with reqwest's builder error, never sent.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::error::BoxError;

#[cfg(feature = "reqwest-middleware")]
mod middleware;
#[cfg(feature = "reqwest-middleware")]
pub use middleware::RetryMiddleware;

/// A [`reqwest::Client`] as a Tower service of `http::Request<B>`, for
/// [`RetryLayer`](crate::RetryLayer) to wrap; see the [module docs](self).
///
/// It is always ready (reqwest pools connections itself), and answers with
/// `http::Response<reqwest::Body>`, which streams: the layer bounds the wait for the
/// response's head, never its body.
#[derive(Clone, Debug, Default)]
pub struct Reqwest {
    inner: ::reqwest::Client,
}

impl Reqwest {
    /// Wraps `client`, whose settings (TLS, proxies, pool, its own timeouts) apply to every
    /// attempt.
    pub const fn new(client: ::reqwest::Client) -> Self {
        Self { inner: client }
    }

    overload_core::define_inner_service_accessors!(::reqwest::Client);
}

impl From<::reqwest::Client> for Reqwest {
    fn from(client: ::reqwest::Client) -> Self {
        Self::new(client)
    }
}

type Pending = <::reqwest::Client as Service<::reqwest::Request>>::Future;

impl<B> Service<Request<B>> for Reqwest
where
    B: Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Response = Response<::reqwest::Body>;
    type Error = ::reqwest::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // NOTE: reqwest's client is always ready; nothing is reserved here, so a clone
        // that was never polled is as ready as this one.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let request = request.map(::reqwest::Body::wrap);
        let state = match ::reqwest::Request::try_from(request) {
            Ok(request) => State::Sent {
                pending: self.inner.call(request),
            },
            Err(error) => State::Refused { error: Some(error) },
        };
        ResponseFuture { state }
    }
}

pin_project! {
    /// The response future of [`Reqwest`].
    pub struct ResponseFuture {
        #[pin]
        state: State,
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        // Handed to reqwest.
        Sent { #[pin] pending: Pending },
        // reqwest refused to build the request (not an absolute URL): never sent.
        Refused { error: Option<::reqwest::Error> },
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<::reqwest::Body>, ::reqwest::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Sent { pending } => pending.poll(cx).map_ok(Response::from),
            StateProj::Refused { error } => match error.take() {
                Some(error) => Poll::Ready(Err(error)),
                // NOTE: polled again after it completed: a contract breach by the caller,
                // answered as reqwest's own `Pending` does, without a panic.
                None => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tower::ServiceExt;

    use super::*;
    use crate::classify::{is_connect_error, is_timeout};

    fn get(url: String) -> Request<::reqwest::Body> {
        Request::get(url).body(::reqwest::Body::from("")).unwrap()
    }

    /// reqwest's timeout error is a type of its own (not an `io::Error`): without the
    /// feature's hook, a `reqwest::Client::timeout` expiring would be final.
    #[tokio::test]
    async fn reqwest_timeouts_and_connect_errors_are_recognised() {
        // Accepts, never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", silent.local_addr().unwrap());
        let client = ::reqwest::Client::builder()
            .timeout(Duration::from_millis(50))
            .build()
            .unwrap();
        let err = Reqwest::new(client).oneshot(get(url)).await.unwrap_err();
        assert!(err.is_timeout(), "{err:?}");
        assert!(is_timeout(&err));
        assert!(!is_connect_error(&err));
        drop(silent);

        // Bound, then closed: nobody listens.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", closed.local_addr().unwrap());
        drop(closed);
        let err = Reqwest::default().oneshot(get(url)).await.unwrap_err();
        assert!(err.is_connect(), "{err:?}");
        assert!(is_connect_error(&err));
        assert!(!is_timeout(&err));
    }

    #[tokio::test]
    async fn a_relative_uri_fails_at_once_with_reqwest_s_builder_error() {
        let request = Request::get("/relative")
            .body(::reqwest::Body::from(""))
            .unwrap();
        let err = Reqwest::default().oneshot(request).await.unwrap_err();
        assert!(err.is_builder(), "{err:?}");
        assert!(!is_connect_error(&err));
        assert!(!is_timeout(&err));
    }
}
