//! The benchmark's HTTP sender: one request, its [`Outcome`], within a timeout.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use tokio::time::Instant;

use super::outcome::{Attempt, Outcome};

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
    rejection_body: Option<Bytes>,
    headers: HeaderMap,
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
            rejection_body: None,
            headers: HeaderMap::new(),
        }
    }

    /// Sends `name: value` with every request (the spike experiment's
    /// `X-Request-Criticality`). Default: no header of the sender's own.
    #[must_use]
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Counts a `503` as rejected only when its body is `body` (trimmed), as
    /// [`Outcome::of_answer`] says; other `503`s failed. For Envoy: `reached concurrency
    /// limit`, its adaptive concurrency filter's. Default: every `503` is a rejection.
    #[must_use]
    pub fn rejection_body(mut self, body: &'static str) -> Self {
        self.rejection_body = Some(Bytes::from_static(body.as_bytes()));
        self
    }

    /// The URL requested.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// One request: [`Outcome::of_response`] of its answer, read to the end;
    /// [`Outcome::Failed`] on a connection error, a body that breaks off, or no full answer
    /// within the timeout (from when the request starts).
    pub fn send(&self) -> impl Future<Output = Outcome> + Send + 'static {
        let exchange = self.exchange();
        let timeout = self.timeout;
        async move {
            match tokio::time::timeout(timeout, exchange).await {
                Ok(Attempt::Ended(outcome)) => outcome,
                Ok(Attempt::NotSent) | Err(_) => Outcome::Failed,
            }
        }
    }

    /// One request scheduled at `scheduled`: its timeout runs from that instant, not from
    /// when the request starts, so a generator that falls behind does not give the system
    /// more time (a served latency, counted from the schedule too, never exceeds the
    /// timeout). [`Attempt::NotSent`] when the generator itself could not connect for want
    /// of a file descriptor or a local port (`EMFILE`, `ENFILE`, `EADDRNOTAVAIL`).
    pub fn send_scheduled(
        &self,
        scheduled: Instant,
    ) -> impl Future<Output = Attempt> + Send + 'static {
        let exchange = self.exchange();
        let deadline = scheduled + self.timeout;
        async move {
            tokio::time::timeout_at(deadline, exchange)
                .await
                .unwrap_or(Attempt::Ended(Outcome::Failed))
        }
    }

    /// The exchange without a timeout.
    fn exchange(&self) -> impl Future<Output = Attempt> + Send + 'static {
        let client = self.client.clone();
        let url = self.url.clone();
        let rejection_body = self.rejection_body.clone();
        let headers = self.headers.clone();
        async move {
            let failed = Attempt::Ended(Outcome::Failed);
            let Ok(mut request) = Request::get(url).body(Empty::new()) else {
                return failed;
            };
            request.headers_mut().extend(headers);
            let response = match client.request(request).await {
                Ok(response) => response,
                Err(e) if is_local_exhaustion(&e) => return Attempt::NotSent,
                Err(_) => return failed,
            };
            let (parts, body) = response.into_parts();
            // NOTE: read the body: a request is served when its answer has arrived, and
            // the connection goes back to the pool only once its body is read.
            let Ok(body) = body
                .collect()
                .await
                .map(http_body_util::Collected::to_bytes)
            else {
                return failed;
            };
            Attempt::Ended(Outcome::of_answer(
                parts.status,
                &parts.headers,
                &body,
                rejection_body.as_deref(),
            ))
        }
    }
}

/// Whether a connection error is the generator's own shortage (no file descriptor or local
/// port left), found anywhere in the error's chain of sources.
fn is_local_exhaustion(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && rustix::io::Errno::from_io_error(io).is_some_and(|n| LOCAL_EXHAUSTION.contains(&n))
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// `EMFILE`, `ENFILE`, `EADDRNOTAVAIL`: the process or the system is out of file
/// descriptors, or no local port is left.
const LOCAL_EXHAUSTION: [rustix::io::Errno; 3] = [
    rustix::io::Errno::MFILE,
    rustix::io::Errno::NFILE,
    rustix::io::Errno::ADDRNOTAVAIL,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::free_port;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on 127.0.0.1 that answers by path: `/ok` 200, `/shed` 503, `/bad` 500,
    /// `/slow` 200 after 1 s, `/sheddable` 200 with `x-request-criticality: sheddable` and
    /// 500 without; keep-alive.
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
                        } else if request.starts_with("GET /bad ")
                            || (request.starts_with("GET /sheddable ")
                                && !request
                                    .to_ascii_lowercase()
                                    .contains("\r\nx-request-criticality: sheddable\r\n"))
                        {
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

    /// Issue 33: a header given to the sender goes out with every request.
    #[tokio::test]
    async fn the_senders_header_goes_out_with_every_request() {
        let addr = server().await;
        let url: Uri = format!("http://{addr}/sheddable").parse().unwrap();
        let bare = HttpSender::new(url, Duration::from_secs(1));
        assert_eq!(bare.send().await, Outcome::Failed, "no header: 500");
        let with_level = bare.header(
            HeaderName::from_static("x-request-criticality"),
            HeaderValue::from_static("sheddable"),
        );
        for _ in 0..2 {
            assert_eq!(with_level.send().await, Outcome::Served);
        }
    }

    /// Review M2: the timeout runs from the scheduled instant. A request scheduled 1 s ago
    /// with a 1.5 s timeout has 0.5 s left: the 1 s answer is too late, though a request
    /// timed from its send would have been served.
    #[tokio::test]
    async fn the_timeout_of_a_scheduled_request_runs_from_its_schedule() {
        let addr = server().await;
        let sender = HttpSender::new(
            format!("http://{addr}/slow").parse().unwrap(),
            Duration::from_millis(1500),
        );
        let a_second_ago = Instant::now() - Duration::from_secs(1);
        assert_eq!(
            sender.send_scheduled(a_second_ago).await,
            Attempt::Ended(Outcome::Failed)
        );
        assert_eq!(
            sender.send_scheduled(Instant::now()).await,
            Attempt::Ended(Outcome::Served)
        );
    }

    /// Review S2: with a rejection body required, Envoy's other 503s are failures.
    #[tokio::test]
    async fn a_503_without_the_rejection_body_fails_when_one_is_required() {
        let addr = server().await;
        let shed = HttpSender::new(
            format!("http://{addr}/shed").parse().unwrap(),
            Duration::from_secs(1),
        );
        assert_eq!(shed.send().await, Outcome::Rejected);
        let envoy = shed.rejection_body("reached concurrency limit");
        assert_eq!(envoy.send().await, Outcome::Failed, "its body is `ok`");
    }

    /// Review S1: the generator's own shortage of descriptors or ports, wherever it sits in
    /// the error's chain, is told apart from the system's failures.
    #[test]
    fn local_exhaustion_is_found_in_the_chain_of_sources() {
        #[derive(Debug)]
        struct Wrapper(std::io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("connect failed")
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let emfile = std::io::Error::from(rustix::io::Errno::MFILE);
        assert!(is_local_exhaustion(&Wrapper(emfile)));
        let port = std::io::Error::from(rustix::io::Errno::ADDRNOTAVAIL);
        assert!(is_local_exhaustion(&port));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!is_local_exhaustion(&Wrapper(refused)));
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
