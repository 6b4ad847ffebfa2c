//! The retry layer as a `reqwest_middleware::Middleware` (the `reqwest-middleware` feature).

use std::error::Error;
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Extensions, Request, Response};
use http_body::Body;
use reqwest_middleware::{Middleware, Next};
use tower_layer::Layer;
use tower_service::Service;

use crate::error::BoxError;
use crate::retry::RetryLayer;

/// The retry layer as a [`reqwest_middleware::Middleware`], for a
/// `reqwest_middleware::ClientWithMiddleware` (the `reqwest-middleware` feature): the way
/// `reqwest-retry`'s users compose, with the whole stack of [`RetryLayer`] instead of
/// `reqwest-retry`'s backoff alone.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use backoff_layer::reqwest::RetryMiddleware;
///
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(RetryMiddleware::new())
///     .build();
/// let text = client.get("http://127.0.0.1:8070/api").send().await?.text().await?;
/// # let _ = text;
/// # Ok(())
/// # }
/// ```
///
/// Customised: any [`RetryLayer`], built as its docs say, converts into one:
///
/// ```
/// use std::time::Duration;
/// use backoff_layer::{RetryLayer, reqwest::RetryMiddleware};
///
/// let layer = RetryLayer::builder()
///     .name("payments")
///     .deadline(Duration::from_secs(5))
///     .build()?;
/// let middleware = RetryMiddleware::from(layer);
/// # let _ = middleware;
/// # Ok::<(), backoff_layer::ConfigError>(())
/// ```
///
/// Every clone of one `RetryMiddleware` (and of the [`RetryLayer`] it was made from) shares
/// one retry budget and one throttle, as the layer's clones do.
///
/// # Extensions and the middlewares after it
///
/// Each attempt runs the middlewares added after this one (`.with(..)` later), then
/// reqwest, with a copy of the request's extensions as this middleware received them: what
/// those middlewares write into their extensions stays with that attempt.
///
/// # Errors
///
/// What the layer returns as an error (see the [crate docs](crate#outcomes)) reaches the
/// caller as `reqwest_middleware::Error`: an error of reqwest's or of a later middleware,
/// returned unchanged, is the same `Error::Reqwest` or `Error::Middleware` it was; the
/// layer's own ([`GaveUp`](crate::GaveUp), [`Overloaded`](crate::Overloaded),
/// [`Throttled`](crate::Throttled)) is an `Error::Middleware`, found in its source chain by
/// [`is_overloaded`](crate::is_overloaded), [`is_throttled`](crate::is_throttled) or a
/// downcast.
#[derive(Clone, Debug, Default)]
pub struct RetryMiddleware {
    layer: RetryLayer,
}

impl RetryMiddleware {
    /// The middleware with every default of [`RetryLayer::new`].
    pub fn new() -> Self {
        Self::default()
    }
}

impl From<RetryLayer> for RetryMiddleware {
    fn from(layer: RetryLayer) -> Self {
        Self { layer }
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl Middleware for RetryMiddleware {
    // NOTE: the signature `#[async_trait]` gives the trait's method, written out so that no
    // proc-macro dependency is needed for one method.
    fn handle<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        request: ::reqwest::Request,
        extensions: &'life1 mut Extensions,
        next: Next<'life2>,
    ) -> BoxFuture<'async_trait, reqwest_middleware::Result<::reqwest::Response>>
    where
        Self: 'async_trait,
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
    {
        Box::pin(async move {
            let request = Request::<::reqwest::Body>::try_from(request)?;
            let mut retry = self.layer.layer(NextService {
                next,
                extensions: extensions.clone(),
            });
            let outcome =
                match poll_fn(|cx| Service::<Request<::reqwest::Body>>::poll_ready(&mut retry, cx))
                    .await
                {
                    Ok(()) => retry.call(request).await,
                    Err(error) => Err(error),
                };
            match outcome {
                Ok(response) => Ok(::reqwest::Response::from(response)),
                Err(error) => Err(into_middleware_error(error)),
            }
        })
    }
}

/// An error of the layer's as `reqwest_middleware::Error`: one that came from below
/// unchanged is unboxed, anything else is carried whole in `Error::Middleware`.
fn into_middleware_error(error: BoxError) -> reqwest_middleware::Error {
    match error.downcast::<reqwest_middleware::Error>() {
        Ok(below) => *below,
        Err(error) => match error.downcast::<::reqwest::Error>() {
            Ok(reqwest) => reqwest_middleware::Error::Reqwest(*reqwest),
            Err(error) => reqwest_middleware::Error::middleware(Layered(error)),
        },
    }
}

/// An error the retry layer returned, carried in `reqwest_middleware::Error::Middleware`:
/// displayed as it is, with itself as the source so that a source-chain search (or a
/// downcast of `source()`) finds it.
struct Layered(BoxError);

impl fmt::Debug for Layered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Layered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Error for Layered {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

/// The rest of the middleware chain as the retry layer's inner service: each call is one
/// attempt, with its own copy of the extensions.
#[derive(Clone)]
struct NextService<'a> {
    next: Next<'a>,
    extensions: Extensions,
}

impl<'a, B> Service<Request<B>> for NextService<'a>
where
    B: Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Response = Response<::reqwest::Body>;
    // NOTE: reqwest's own error is boxed as itself, not as `Error::Reqwest`, whose
    // transparent `source()` would hide it from the classifier (a reqwest timeout is
    // recognised by downcasting to `reqwest::Error`).
    type Error = BoxError;
    type Future = BoxFuture<'a, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // NOTE: `Next::run` has no readiness of its own; nothing is reserved.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let next = self.next.clone();
        let mut extensions = self.extensions.clone();
        Box::pin(async move {
            let request = ::reqwest::Request::try_from(request.map(::reqwest::Body::wrap))?;
            match next.run(request, &mut extensions).await {
                Ok(response) => Ok(Response::from(response)),
                Err(reqwest_middleware::Error::Reqwest(error)) => Err(error.into()),
                Err(error) => Err(error.into()),
            }
        })
    }
}
