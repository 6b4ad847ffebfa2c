//! The benchmark's HTTP sender: one request, its [`Outcome`], within a timeout.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::outcome::Outcome;

/// Sends `GET url` over HTTP/1.1 and keep-alive connections (a hyper-util pool shared by
/// every request of the sender), each request given `timeout` for its whole answer, body
/// included.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use demo_client::bench::send::HttpSender;
///
/// let sender = HttpSender::new("http://127.0.0.1:8070/api".parse()?, Duration::from_secs(2));
/// let outcome = sender.send().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct HttpSender {
    client: Client<HttpConnector, Empty<Bytes>>,
    url: Uri,
    timeout: Duration,
}

impl HttpSender {
    /// A sender of `GET url`, each request failed after `timeout`.
    pub fn new(url: Uri, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        // NOTE: small answers on loopback: Nagle's delay would be charged to the system.
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Self {
            client,
            url,
            timeout,
        }
    }

    /// The URL requested.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// One request: [`Outcome::of_response`] of its answer, read to the end;
    /// [`Outcome::Failed`] on a connection error, a body that breaks off, or no full answer
    /// within the timeout.
    pub fn send(&self) -> impl Future<Output = Outcome> + Send + 'static {
        let client = self.client.clone();
        let url = self.url.clone();
        let timeout = self.timeout;
        async move {
            let exchange = async {
                let request = Request::get(url).body(Empty::new()).ok()?;
                let response = client.request(request).await.ok()?;
                let outcome = Outcome::of_response(response.status(), response.headers());
                // NOTE: read the body: a request is served when its answer has arrived, and
                // the connection goes back to the pool only once its body is read.
                response.into_body().collect().await.ok()?;
                Some(outcome)
            };
            match tokio::time::timeout(timeout, exchange).await {
                Ok(Some(outcome)) => outcome,
                Ok(None) | Err(_) => Outcome::Failed,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::free_port;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on 127.0.0.1 that answers by path: `/ok` 200, `/shed` 503, `/bad` 500,
    /// `/slow` 200 after 1 s; keep-alive.
    async fn server() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0; 4096];
                    loop {
                        let n = stream.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                        let status = if request.starts_with("GET /shed ") {
                            "503 Service Unavailable"
                        } else if request.starts_with("GET /bad ") {
                            "500 Internal Server Error"
                        } else {
                            if request.starts_with("GET /slow ") {
                                tokio::time::sleep(Duration::from_secs(1)).await;
                            }
                            "200 OK"
                        };
                        let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\n\r\nok");
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn answers_timeouts_and_refused_connections_become_outcomes() {
        let addr = server().await;
        let timeout = Duration::from_millis(300);
        let at =
            |path: &str| HttpSender::new(format!("http://{addr}{path}").parse().unwrap(), timeout);
        assert_eq!(at("/ok").send().await, Outcome::Served);
        assert_eq!(at("/shed").send().await, Outcome::Rejected);
        assert_eq!(at("/bad").send().await, Outcome::Failed);
        assert_eq!(
            at("/slow").send().await,
            Outcome::Failed,
            "over the timeout"
        );
        let closed = free_port().unwrap();
        let refused = HttpSender::new(format!("http://{closed}/ok").parse().unwrap(), timeout);
        assert_eq!(refused.send().await, Outcome::Failed);
    }

    #[tokio::test]
    async fn requests_share_keep_alive_connections() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = std::sync::Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0; 4096];
                    while stream.read(&mut buf).await.unwrap_or(0) > 0 {
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let sender = HttpSender::new(
            format!("http://{addr}/api").parse().unwrap(),
            Duration::from_secs(2),
        );
        for _ in 0..5 {
            assert_eq!(sender.send().await, Outcome::Served);
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
