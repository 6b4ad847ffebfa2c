//! The response future of [`RateLimit`](crate::RateLimit): [`ResponseFuture`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{HeaderValue, Response};
use overload_signal::protocol::{RATELIMIT, RATELIMIT_POLICY};
use pin_project_lite::pin_project;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): the inner service's future
    /// for an admitted request (adding the `RateLimit` fields if configured), or a ready
    /// rejection.
    pub struct ResponseFuture<F, B> {
        #[pin]
        kind: Kind<F, B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B> {
        Admitted {
            #[pin]
            future: F,
            fields: Option<(HeaderValue, HeaderValue)>,
        },
        Rejected {
            response: Option<Response<B>>,
        },
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn admitted(future: F, fields: Option<(HeaderValue, HeaderValue)>) -> Self {
        Self {
            kind: Kind::Admitted { future, fields },
        }
    }

    pub(crate) fn rejected(response: Response<B>) -> Self {
        Self {
            kind: Kind::Rejected {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Admitted { future, fields } => {
                let mut response = ready!(future.poll(cx))?;
                if let Some((policy, status)) = fields.take() {
                    // NOTE: appended, not inserted: an inner limiter's fields stay, and the
                    // client sees every policy that applies (the draft's list form).
                    let headers = response.headers_mut();
                    headers.append(RATELIMIT_POLICY, policy);
                    headers.append(RATELIMIT, status);
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Rejected { response } => Poll::Ready(Ok(response
                .take()
                .expect("rate limit response future polled after completion"))),
        }
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Admitted { .. } => "admitted",
            Kind::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
