//! The client a tier uses to call the next one: hyper-util behind `backoff-layer`'s retry.

use std::fmt;
use std::time::Duration;

use backoff_layer::budget::RetryBudget;
use backoff_layer::{BoxError, ReplayBody, RetryLayer};
use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceExt;
use tower::util::BoxCloneSyncService;

/// The per-attempt timeout of a downstream call: 2 seconds, the article's client timeout.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

type Transport = BoxCloneSyncService<Request<Full<Bytes>>, http::Response<Bytes>, BoxError>;

/// The next tier: `GET <url>` through the full client stack.
///
/// The stack is `backoff-layer`'s [`RetryLayer`] with its defaults (the article's
/// exponential backoff with jitter, at most 3 attempts, `X-Request-Attempt` on every attempt,
/// never a retry after the stop signal), a [`RetryBudget`] with its defaults (retries at most
/// 10% of requests) shared by every request of this server, and a per-attempt timeout of
/// [`ATTEMPT_TIMEOUT`], over a hyper-util HTTP/1 client with connection pooling.
///
/// When the next tier answers with the stop signal, the retry layer returns the
/// [`Overloaded`](overload_signal::Overloaded) error and raises the propagation marker;
/// `/api` then answers its own caller with the stop signal.
#[derive(Clone)]
pub struct Downstream {
    uri: Uri,
    client: Transport,
}

impl Downstream {
    /// A downstream at `uri`.
    ///
    /// # Errors
    ///
    /// [`InvalidDownstream`] when the URL is not an absolute `http://` URL with a host
    /// (`https` is not supported: the demo's tiers talk plain HTTP on one machine).
    pub fn new(uri: Uri) -> Result<Self, InvalidDownstream> {
        if uri.scheme() != Some(&http::uri::Scheme::HTTP) {
            return Err(InvalidDownstream(
                "the downstream URL must start with http://",
            ));
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(InvalidDownstream("the downstream URL must have a host"));
        }
        let retry = RetryLayer::builder()
            .budget(RetryBudget::default())
            .attempt_timeout(ATTEMPT_TIMEOUT)
            .build()
            .map_err(|_| InvalidDownstream("the retry configuration is invalid"))?;
        let http = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>();
        // NOTE: the body is read inside the retry layer's attempt, so a body that fails half
        // way is an error the classifier sees, and the connection goes back to the pool.
        let transport = tower::service_fn(move |request: Request<ReplayBody<Full<Bytes>>>| {
            let http = http.clone();
            async move {
                let response = http.request(request).await?;
                let (parts, body) = response.into_parts();
                let bytes = body.collect().await?.to_bytes();
                Ok::<_, BoxError>(http::Response::from_parts(parts, bytes))
            }
        });
        let client = tower::ServiceBuilder::new().layer(retry).service(transport);
        Ok(Self {
            uri,
            client: BoxCloneSyncService::new(client),
        })
    }

    /// The URL called.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// Calls the downstream once (with the retries the stack allows); returns the final
    /// status.
    pub(crate) async fn call(&self) -> Result<StatusCode, BoxError> {
        let request = Request::get(self.uri.clone()).body(Full::new(Bytes::new()))?;
        let response = self.client.clone().oneshot(request).await?;
        Ok(response.status())
    }
}

impl fmt::Debug for Downstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Downstream")
            .field("uri", &self.uri)
            .finish_non_exhaustive()
    }
}

/// An unusable `--downstream` URL; the message says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidDownstream(&'static str);

impl fmt::Display for InvalidDownstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for InvalidDownstream {}
