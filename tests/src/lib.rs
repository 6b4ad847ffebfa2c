//! Shared helpers for the cross-crate tests: real servers on 127.0.0.1, port 0.

pub mod compare;
pub mod fleet;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A server running on 127.0.0.1 until dropped.
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl TestServer {
    /// Serves `handler` (HTTP/1 and HTTP/2) on 127.0.0.1 on a free port.
    pub async fn start<H, Fut>(handler: H) -> std::io::Result<Self>
    where
        H: Fn(http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let handler = handler.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let fut = handler(req);
                        async move { Ok::<_, Infallible>(fut.await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> http::Uri {
        format!("http://{}{}", self.addr, path)
            .parse()
            .expect("a socket address and a path form a URI")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Builds a binary of the workspace (`demo-server`, `demo-client`) with the cargo running
/// the test, and returns its path: a test cannot depend on another package's binary.
///
/// NOTE: `--workspace` resolves features as `cargo test --workspace` does, so under it this
/// build finds the binary that command already built, instead of rebuilding it with the
/// package's features alone (a minute or more on a 2-core machine, outside a test's time
/// bound).
pub fn workspace_binary(name: &str) -> PathBuf {
    let output = Command::new(env!("CARGO"))
        .args([
            "build",
            "--quiet",
            "--workspace",
            "--bin",
            name,
            "--message-format=json",
        ])
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "building {name} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The last artifact message names the executable; read it without a JSON parser.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = stdout
        .lines()
        .filter_map(|line| line.split_once("\"executable\":\"")?.1.split_once('"'))
        .map(|(path, _)| PathBuf::from(path))
        .next_back()
        .unwrap_or_else(|| panic!("cargo reports the {name} executable"));
    assert!(path.is_file(), "{}", path.display());
    path
}
