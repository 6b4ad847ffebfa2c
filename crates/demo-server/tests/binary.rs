//! The `demo-server` executable: startup line, a request, a busy port, graceful shutdown.
#![cfg(unix)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::{BIN, Server};

fn get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// Waits for the child to exit, at most 10 s.
async fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    for _ in 0..1000 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the server did not exit within 10 s");
}

// NOTE: the blocking socket and process calls are fine here: nothing else runs on this
// runtime; it is only there for the sleep while waiting for the child to exit.
/// A child `demo-server` (see `support::start`).
fn start_server(args: &[&str]) -> Server {
    support::start(args, Stdio::piped())
}

#[tokio::test]
async fn serves_refuses_a_busy_port_and_shuts_down_on_sigterm() {
    let mut server = start_server(&[
        "--model",
        "instant",
        "--backlog",
        "4096",
        "--abandoned",
        "serve",
    ]);
    let health = get(server.addr, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200 OK"), "{health}");
    let api = get(server.addr, "/api");
    assert!(api.starts_with("HTTP/1.1 200 OK"), "{api}");
    let metrics = get(server.addr, "/metrics");
    assert!(
        metrics.contains("demo_server_requests_total{outcome=\"served\"} 1"),
        "{metrics}"
    );

    // A second server on the same address fails with a clear message.
    let busy = Command::new(BIN)
        .args(["--listen", &server.addr.to_string()])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&busy.stderr);
    assert!(
        stderr.contains("already in use") && stderr.contains("--listen"),
        "{stderr}"
    );

    // SIGTERM: a graceful exit with status 0.
    let killed = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = wait_exit(&mut server.child).await;
    assert!(status.success(), "{status:?}");
    let mut stderr = String::new();
    server
        .child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(stderr.contains("shutting down"), "{stderr}");
    // The overload layer told its callers apart by their address: the server's connections
    // insert it as the `SocketAddr` extension the layers read (the line the layer logs
    // otherwise says "requests without a peer address", or "... without a caller key").
    for unkeyed in [
        "without a peer address",
        "without a caller key",
        "no caller key",
    ] {
        assert!(!stderr.contains(unkeyed), "{stderr}");
    }
}

#[test]
fn bad_flags_exit_with_usage_errors() {
    let out = Command::new(BIN)
        .args(["--stack", "half"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "[possible values: full, adaptive, deadline, none, tower-shed, tower-resilience, little]"
        ),
        "{stderr}"
    );

    let out = Command::new(BIN)
        .args(["--algorithm", "fixed-window", "--burst", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("burst"),
        "{out:?}"
    );

    for bad in [
        ["--backlog", "0"],
        ["--abandoned", "sometimes"],
        ["--header-read-timeout", "0s"],
        ["--max-connections", "0"],
        ["--max-downstream-body", "lots"],
    ] {
        let out = Command::new(BIN).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(bad[0]),
            "{out:?}"
        );
    }

    // A limits file with an error: the server does not start, and says where.
    let limits = std::env::temp_dir().join(format!("binary-limits-{}.toml", std::process::id()));
    std::fs::write(&limits, "[default]\nrate = 10\nburst = 0\n").unwrap();
    let out = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--limits"])
        .arg(&limits)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&limits);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "--limits: {}:3:9: [default]: burst must be at least 1, got 0",
            limits.display()
        )),
        "{stderr}"
    );

    let help = Command::new(BIN).arg("--help").output().unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--listen",
        "--stack",
        "--rate-limit",
        "--burst",
        "--algorithm",
        "--key",
        "--downstream",
        "--model",
        "--backlog",
        "--abandoned",
        "--header-read-timeout",
        "--max-connections",
        "--max-downstream-body",
        "--limits",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help");
    }
}

/// The limits for hostile peers, through the binary's flags: unfinished headers are closed
/// after `--header-read-timeout`, and a flood of them past `--max-connections` does not lock
/// out `/healthz`.
#[tokio::test]
async fn slow_clients_are_closed_and_cannot_lock_out_healthz() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = start_server(&[
        "--model",
        "instant",
        "--header-read-timeout",
        "1s",
        "--max-connections",
        "16",
    ]);
    let mut slow = Vec::new();
    for _ in 0..48 {
        let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        s.write_all(b"GET /api HTTP/1.1\r\nhost: slo")
            .await
            .unwrap();
        slow.push(s);
    }
    let started = tokio::time::Instant::now();
    let health = tokio::task::spawn_blocking(move || get(server.addr, "/healthz"))
        .await
        .unwrap();
    assert!(health.starts_with("HTTP/1.1 200 OK"), "{health}");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    // Every slow connection is closed by the server: by the cap, or after the timeout.
    for mut s in slow {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "a slow connection is still open: {read:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[cfg(target_os = "linux")]
/// One `GET /api` from `source` (an address on this machine), returning the status line.
async fn get_from(source: &str, addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream
        .write_all(b"GET /api HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.lines().next().unwrap_or_default().to_owned()
}

// NOTE: Linux routes all of 127.0.0.0/8 to loopback; other systems configure 127.0.0.1 only.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn key_ip_limits_each_client_address_separately() {
    let server = start_server(&[
        "--model",
        "instant",
        "--key",
        "ip",
        "--rate-limit",
        "1",
        "--burst",
        "1",
    ]);
    assert_eq!(get_from("127.0.0.1", server.addr).await, "HTTP/1.1 200 OK");
    assert_eq!(
        get_from("127.0.0.1", server.addr).await,
        "HTTP/1.1 429 Too Many Requests"
    );
    // Another client address (all of 127.0.0.0/8 is loopback on Linux) has its own limit.
    assert_eq!(get_from("127.0.0.2", server.addr).await, "HTTP/1.1 200 OK");
}
