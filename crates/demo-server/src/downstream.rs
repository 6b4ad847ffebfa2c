//! The client a tier uses to call the next one: hyper-util behind `backoff-layer`'s retry.

use std::fmt;
use std::time::Duration;

use backoff_layer::budget::RetryBudget;
use backoff_layer::{BoxError, ReplayBody, RetryLayer};
use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
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
/// The response body is read whole, up to a cap ([`Downstream::DEFAULT_MAX_BODY`] unless
/// set with [`Downstream::with_max_body`]): a longer body (a misbehaving or hostile
/// downstream, an endless chunked stream) fails the call, and `/api` answers `502 Bad
/// Gateway`, instead of growing the server's memory without bound.
///
/// When the next tier answers with the stop signal, the retry layer returns the
/// [`Overloaded`](overload_signal::Overloaded) error and raises the propagation marker;
/// `/api` then answers its own caller with the stop signal.
#[derive(Clone)]
pub struct Downstream {
    uri: Uri,
    max_body: usize,
    client: Transport,
}

impl Downstream {
    /// The default cap on a downstream response body: 1 MiB, Envoy's default per-connection
    /// buffer limit. The demo's own responses are a few bytes.
    pub const DEFAULT_MAX_BODY: usize = 1 << 20;

    /// A downstream at `uri`, its response bodies capped at [`Self::DEFAULT_MAX_BODY`].
    ///
    /// # Errors
    ///
    /// [`InvalidDownstream`] when the URL is not an absolute `http://` URL with a host
    /// (`https` is not supported: the demo's tiers talk plain HTTP on one machine).
    pub fn new(uri: Uri) -> Result<Self, InvalidDownstream> {
        Self::with_max_body(uri, Self::DEFAULT_MAX_BODY)
    }

    /// A downstream at `uri` whose response bodies may be at most `max_body` bytes long.
    ///
    /// # Errors
    ///
    /// As [`Downstream::new`].
    pub fn with_max_body(uri: Uri, max_body: usize) -> Result<Self, InvalidDownstream> {
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
                let bytes = Limited::new(body, max_body)
                    .collect()
                    .await
                    .map_err(|e| body_error(e, max_body))?
                    .to_bytes();
                Ok::<_, BoxError>(http::Response::from_parts(parts, bytes))
            }
        });
        let client = tower::ServiceBuilder::new().layer(retry).service(transport);
        Ok(Self {
            uri,
            max_body,
            client: BoxCloneSyncService::new(client),
        })
    }

    /// The URL called.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The cap on a response body, in bytes.
    pub fn max_body(&self) -> usize {
        self.max_body
    }

    /// Calls the downstream once (with the retries the stack allows); returns the final
    /// status.
    pub(crate) async fn call(&self) -> Result<StatusCode, BoxError> {
        let request = Request::get(self.uri.clone()).body(Full::new(Bytes::new()))?;
        let response = self.client.clone().oneshot(request).await?;
        Ok(response.status())
    }
}

/// Names the cap when `error` is the body limit's.
fn body_error(error: BoxError, max_body: usize) -> BoxError {
    if error.is::<LengthLimitError>() {
        format!(
            "the response body is longer than the {} limit",
            crate::size::format_size(max_body)
        )
        .into()
    } else {
        error
    }
}

impl fmt::Debug for Downstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Downstream")
            .field("uri", &self.uri)
            .field("max_body", &self.max_body)
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
