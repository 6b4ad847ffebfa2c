//! The demo server's connection handling (`demo_server::server`) on real sockets on
//! 127.0.0.1: the article's semantics for abandoned requests, the header read timeout, the
//! connection cap, the downstream body cap, HTTP/2 and graceful shutdown.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use demo_server::app::{AppConfig, app};
use demo_server::downstream::Downstream;
use demo_server::model::{ArticleModel, LatencyModel, Model};
use demo_server::server::{Abandoned, ConnectionStats, Server, ServerConfig};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

/// A server on 127.0.0.1, port 0, stopped (gracefully) by [`Running::stop`].
struct Running {
    addr: SocketAddr,
    stats: ConnectionStats,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn start(router: Router, config: ServerConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(listener, router, config)
    }

    fn start_on(listener: TcpListener, router: Router, config: ServerConfig) -> Self {
        let addr = listener.local_addr().unwrap();
        let server = Server::new(listener, router, config);
        let stats = server.stats();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stats,
            stop: Some(stop),
            task,
        }
    }

    /// Starts the graceful shutdown and waits (at most 10 s) for `run` to return.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("the server stops")
            .unwrap()
            .unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A model whose requests take `secs` seconds each (the article's, with a flat delay).
fn slow_model(secs: u64) -> Model {
    let latency = ArticleModel::builder()
        .base(Duration::from_secs(secs))
        .max_delay(Duration::from_secs(secs))
        .build()
        .unwrap();
    Model::new(latency.into())
}

fn config(abandoned: Abandoned) -> ServerConfig {
    ServerConfig::builder()
        .abandoned(abandoned)
        .build()
        .unwrap()
}

/// Waits (at most 10 s) until `done` holds.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    done()
}

const GET_API: &[u8] = b"GET /api HTTP/1.1\r\nhost: test\r\n\r\n";

/// `n` clients that each send one request and half-close their connection (FIN) at once.
async fn half_closed_requests(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(GET_API).await.unwrap();
        s.shutdown().await.unwrap();
        streams.push(s);
    }
    streams
}

/// Runs 50 half-closed requests against a server in `abandoned` mode, in the two orders a
/// real server meets them: sent while the server was not accepting (what a server resumed
/// after SIGSTOP finds in its listen queue, from clients that timed out meanwhile), and sent
/// to a running server. Returns the model's concurrency 300 ms after each.
async fn half_closed_concurrency(abandoned: Abandoned) -> [usize; 2] {
    let mut after = [0; 2];
    for (i, queued_first) in [true, false].into_iter().enumerate() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let model = slow_model(60);
        let router = app(AppConfig::new(model.clone()));
        let (queued, server) = if queued_first {
            let queued = half_closed_requests(addr, 50).await;
            (
                queued,
                Running::start_on(listener, router, config(abandoned)),
            )
        } else {
            let server = Running::start_on(listener, router, config(abandoned));
            (half_closed_requests(addr, 50).await, server)
        };
        assert!(
            eventually(|| server.stats.open() == 0).await,
            "{} connections still open",
            server.stats.open()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        after[i] = model.concurrency();
        drop((queued, server));
    }
    after
}

/// Regression: with hyper's Tower adapter, `--abandoned serve` ran almost none of these
/// (concurrency 1 of 50 when sent to a running server): hyper parsed each request, saw the
/// end of the stream and dropped the response future before the handler ever ran.
#[tokio::test]
async fn serve_works_on_every_request_whose_client_half_closed() {
    // Their connections are gone; their work is not.
    assert_eq!(half_closed_concurrency(Abandoned::Serve).await, [50, 50]);
}

/// hyper's own behaviour, kept as `--abandoned cancel`: the work of such requests stops
/// (or never starts).
#[tokio::test]
async fn cancel_stops_the_work_of_every_request_whose_client_half_closed() {
    assert_eq!(half_closed_concurrency(Abandoned::Cancel).await, [0, 0]);
}

/// One `GET path` on a fresh connection, `connection: close`; the whole response text.
async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut text = String::new();
    timeout(Duration::from_secs(10), s.read_to_string(&mut text))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    text
}

/// Reads until the server closes `stream`; returns how long that took. Panics after 10 s.
async fn closed_after(stream: &mut TcpStream) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return start.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection is still open after 10 s"),
        }
    }
}

#[tokio::test]
async fn unfinished_headers_are_closed_after_the_header_read_timeout() {
    let limit = Duration::from_millis(400);
    let config = ServerConfig::builder()
        .header_read_timeout(limit)
        .build()
        .unwrap();
    let server = Running::start(
        app(AppConfig::new(Model::new(LatencyModel::Instant))),
        config,
    )
    .await;
    let addr = server.addr;
    let probes = [
        // Half a request head, then nothing: HTTP/1 slowloris.
        ("partial", &b"GET /api HTTP/1.1\r\nhost: te"[..]),
        // A client that never says a word (not even which HTTP version it speaks).
        ("silent", b""),
        // Half of the HTTP/2 preface.
        ("h2", b"PRI * HTTP/2.0\r\n"),
    ]
    .map(|(name, bytes)| {
        tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let start = Instant::now();
            stream.write_all(bytes).await.unwrap();
            closed_after(&mut stream).await;
            (name, start.elapsed())
        })
    });
    for probe in probes {
        let (name, took) = probe.await.unwrap();
        assert!(
            took + Duration::from_millis(50) >= limit && took < limit * 5,
            "{name} closed after {took:?}"
        );
    }
    assert_eq!(server.stats.header_timeouts(), 3);
    assert!(eventually(|| server.stats.open() == 0).await);
}

#[tokio::test]
async fn a_request_slower_than_the_header_timeout_is_not_cut() {
    // The model takes 1 s; the header timeout is 200 ms; the request was complete in time.
    let config = ServerConfig::builder()
        .header_read_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let server = Running::start(app(AppConfig::new(slow_model(1))), config).await;
    let response = get(server.addr, "/api").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(server.stats.header_timeouts(), 0);
}

#[tokio::test]
async fn the_connection_cap_keeps_healthz_answering_under_slow_connections() {
    let cap = 20;
    // A header timeout far longer than the test: only the cap can make room.
    let config = ServerConfig::builder()
        .max_connections(NonZeroUsize::new(cap).unwrap())
        .header_read_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let server = Running::start(
        app(AppConfig::new(Model::new(LatencyModel::Instant))),
        config,
    )
    .await;
    let mut slow = Vec::new();
    for _ in 0..cap * 3 {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(b"GET /api HTTP/1.1\r\n").await.unwrap();
        slow.push(s);
    }
    assert!(
        eventually(|| server.stats.open() == cap).await,
        "{}",
        server.stats.open()
    );
    for _ in 0..5 {
        let started = Instant::now();
        let response = get(server.addr, "/healthz").await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    assert!(server.stats.open() <= cap, "{} open", server.stats.open());
    // Each connection past the cap, the health checks' included, closed an idle one.
    assert!(
        server.stats.evicted() >= (cap * 2) as u64,
        "{}",
        server.stats.evicted()
    );
}

#[tokio::test]
async fn at_the_cap_with_every_connection_busy_a_new_one_waits_its_turn() {
    let config = ServerConfig::builder()
        .max_connections(NonZeroUsize::new(2).unwrap())
        .build()
        .unwrap();
    let server = Running::start(app(AppConfig::new(slow_model(1))), config).await;
    let addr = server.addr;
    let busy: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { get(addr, "/api").await }))
        .collect();
    assert!(eventually(|| server.stats.open() == 2).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let health = get(addr, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    // It waited in the listen queue for a request to end: nothing was cut.
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    for b in busy {
        let response = b.await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    assert_eq!(server.stats.evicted(), 0);
}

#[tokio::test]
async fn http2_is_served_too() {
    let server = Running::start(
        app(AppConfig::new(Model::new(LatencyModel::Instant))),
        ServerConfig::new(),
    )
    .await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let response = client
        .request(
            Request::get(format!("http://{}/api", server.addr))
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn graceful_shutdown_finishes_requests_in_progress() {
    let server = Running::start(app(AppConfig::new(slow_model(1))), ServerConfig::new()).await;
    let addr = server.addr;
    let in_progress = tokio::spawn(async move { get(addr, "/api").await });
    // An idle keep-alive connection: closed at once by the shutdown.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(eventually(|| server.stats.open() == 2).await);
    let started = Instant::now();
    server.stop().await;
    // `stop` returned only once the request in progress had its answer.
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    let response = in_progress.await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    closed_after(&mut idle).await;
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}

/// A downstream that answers with an endless chunked body.
async fn endless_downstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = s.read(&mut head).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await;
                let chunk = format!("{:x}\r\n{}\r\n", 8192, "x".repeat(8192));
                while s.write_all(chunk.as_bytes()).await.is_ok() {}
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_endless_downstream_body_is_a_502_not_a_memory_leak() {
    let bottom = endless_downstream().await;
    let downstream =
        Downstream::with_max_body(format!("http://{bottom}/api").parse().unwrap(), 64 * 1024)
            .unwrap();
    let config = AppConfig::new(Model::new(LatencyModel::Instant)).downstream(downstream);
    let stats = config.stats().clone();
    let server = Running::start(app(config), ServerConfig::new()).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = timeout(
        Duration::from_secs(10),
        client.request(
            Request::get(format!("http://{}/api", server.addr))
                .body(Full::default())
                .unwrap(),
        ),
    )
    .await
    .expect("an answer, not an endless read")
    .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("longer than the 64KiB limit"), "{text}");
    assert_eq!(stats.snapshot().failed, 1);
}

#[tokio::test]
async fn a_downstream_body_within_the_cap_is_read_whole() {
    let bottom = Running::start(
        app(AppConfig::new(Model::new(LatencyModel::Instant))),
        ServerConfig::new(),
    )
    .await;
    // "ok\n" is 3 bytes: a 3-byte cap admits it.
    let downstream =
        Downstream::with_max_body(format!("http://{}/api", bottom.addr).parse().unwrap(), 3)
            .unwrap();
    let top = Running::start(
        app(AppConfig::new(Model::new(LatencyModel::Instant)).downstream(downstream)),
        ServerConfig::new(),
    )
    .await;
    let response = get(top.addr, "/api").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}
