//! The transport under the client stack: a hyper-util client, and [`Collect`], which reads
//! each response body whole, up to a cap, so that the per-attempt timeout above it bounds
//! the entire exchange.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use backoff_layer::ReplayBody;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use pin_project_lite::pin_project;
use tower::BoxError;
use tower_layer::Layer;
use tower_service::Service;

/// The body of every request and response in the demo stack: small and replayable.
pub type DemoBody = Full<Bytes>;

/// The request body the transport receives: `backoff-layer`'s replayable body under its retry
/// layer (the `full` strategy), or the caller's own body, cloned for each attempt, under
/// [`NaiveRetry`](super::NaiveRetry) (`fixed` and `exponential`).
///
/// One type for both, so that every strategy sends through the same transport.
pub type TransportBody = Either<ReplayBody<DemoBody>, DemoBody>;

/// The hyper-util legacy client the `run` and `scenario` commands send through.
pub type HttpTransport = Client<HttpConnector, TransportBody>;

/// A hyper-util legacy client for plain HTTP/1 on 127.0.0.1.
///
/// Connections are pooled and kept alive, as a real client's would be; connecting is not
/// bounded here because the per-attempt timeout above bounds it. Up to `max_idle` idle
/// connections are kept (the demo's clients are bursty, so keeping about one per client
/// avoids reconnecting on every request).
pub fn http_transport(max_idle: usize) -> HttpTransport {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(max_idle)
        .build(connector)
}

/// Reads whole response bodies into [`DemoBody`], up to a cap; see [`Collect`].
#[derive(Debug, Clone, Copy)]
pub struct CollectLayer {
    max_body: usize,
}

impl CollectLayer {
    /// The default cap on a response body: 1 MiB, Envoy's default per-connection buffer
    /// limit. The demo server's responses are a few bytes.
    pub const DEFAULT_MAX_BODY: usize = 1 << 20;

    /// Reads bodies of at most `max_body` bytes.
    pub const fn new(max_body: usize) -> Self {
        Self { max_body }
    }
}

impl Default for CollectLayer {
    /// A cap of [`CollectLayer::DEFAULT_MAX_BODY`].
    fn default() -> Self {
        Self::new(Self::DEFAULT_MAX_BODY)
    }
}

impl<S> Layer<S> for CollectLayer {
    type Service = Collect<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Collect::new(inner, self.max_body)
    }
}

/// Reads the whole response body before answering, so that a timeout above it bounds the
/// entire exchange and the layers above see a replayable [`DemoBody`].
///
/// A body longer than the cap fails the attempt with [`BodyTooLong`] as soon as the cap is
/// passed, instead of growing the client's memory without bound (a hostile or broken server
/// can send an endless chunked body).
#[derive(Debug, Clone)]
pub struct Collect<S> {
    inner: S,
    max_body: usize,
}

impl<S> Collect<S> {
    /// Wraps `inner`, reading bodies of at most `max_body` bytes.
    pub const fn new(inner: S, max_body: usize) -> Self {
        Self { inner, max_body }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Collect<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: Body,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<DemoBody>;
    type Error = BoxError;
    type Future = CollectFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        CollectFuture {
            head: self.inner.call(request),
            parts: None,
            body: None,
            data: BytesMut::new(),
            max_body: self.max_body,
        }
    }
}

pin_project! {
    /// The response future of [`Collect`].
    pub struct CollectFuture<F, B> {
        #[pin]
        head: F,
        parts: Option<http::response::Parts>,
        #[pin]
        body: Option<B>,
        data: BytesMut,
        max_body: usize,
    }
}

impl<F, B> fmt::Debug for CollectFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectFuture")
            .field("received", &self.data.len())
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for CollectFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Body,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<DemoBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if this.body.is_none() {
            let (parts, body) = ready!(this.head.poll(cx)).map_err(Into::into)?.into_parts();
            *this.parts = Some(parts);
            this.body.set(Some(body));
        }
        let Some(mut body) = this.body.as_mut().as_pin_mut() else {
            return Poll::Ready(Err("collect future polled after completion".into()));
        };
        while let Some(frame) = ready!(body.as_mut().poll_frame(cx)) {
            if let Ok(data) = frame.map_err(Into::into)?.into_data() {
                if this.data.len().saturating_add(data.remaining()) > *this.max_body {
                    return Poll::Ready(Err(Box::new(BodyTooLong {
                        max_body: *this.max_body,
                    })));
                }
                this.data.put(data);
            }
        }
        let parts = this
            .parts
            .take()
            .ok_or("collect future polled after completion")?;
        let data = std::mem::take(this.data).freeze();
        Poll::Ready(Ok(Response::from_parts(parts, Full::new(data))))
    }
}

/// A response body longer than [`Collect`]'s cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyTooLong {
    max_body: usize,
}

impl BodyTooLong {
    /// The cap that was passed, in bytes.
    pub const fn max_body(&self) -> usize {
        self.max_body
    }
}

impl fmt::Display for BodyTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the response body is longer than the {} limit",
            demo_server::size::format_size(self.max_body)
        )
    }
}

impl std::error::Error for BodyTooLong {}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn answering(
        body: &'static [u8],
    ) -> impl Service<
        Request<DemoBody>,
        Response = Response<DemoBody>,
        Error = BoxError,
        Future: Send,
    > + Clone {
        tower::service_fn(move |_req: Request<DemoBody>| async move {
            Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(body))))
        })
    }

    #[tokio::test]
    async fn collect_reads_the_whole_body() {
        let svc = CollectLayer::default().layer(answering(b"hello"));
        let response = svc
            .oneshot(Request::get("/").body(DemoBody::default()).unwrap())
            .await
            .unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"hello");
    }

    /// Over a real socket: a server that answers with an endless chunked body.
    #[tokio::test]
    async fn an_endless_body_is_an_error_not_a_memory_leak() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 4096];
            let _ = s.read(&mut head).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                .await;
            let chunk = format!("{:x}\r\n{}\r\n", 8192, "x".repeat(8192));
            while s.write_all(chunk.as_bytes()).await.is_ok() {}
        });
        let client = Client::builder(TokioExecutor::new()).build_http::<DemoBody>();
        let svc = CollectLayer::new(64 * 1024).layer(client);
        let request = Request::get(format!("http://{addr}/api"))
            .body(DemoBody::default())
            .unwrap();
        let err = tokio::time::timeout(std::time::Duration::from_secs(10), svc.oneshot(request))
            .await
            .expect("an error, not an endless read")
            .unwrap_err();
        assert!(err.is::<BodyTooLong>(), "{err}");
    }

    #[tokio::test]
    async fn a_body_over_the_cap_is_an_error() {
        let at_cap = CollectLayer::new(5).layer(answering(b"hello"));
        assert!(
            at_cap
                .oneshot(Request::get("/").body(DemoBody::default()).unwrap())
                .await
                .is_ok()
        );
        let over = CollectLayer::new(4).layer(answering(b"hello"));
        let err = over
            .oneshot(Request::get("/").body(DemoBody::default()).unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.downcast_ref::<BodyTooLong>().unwrap().max_body(), 4);
        assert_eq!(
            err.to_string(),
            "the response body is longer than the 4B limit"
        );
    }
}
