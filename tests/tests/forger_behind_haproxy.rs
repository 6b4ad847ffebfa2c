//! One client that forges its attempt counter, among honest ones, all behind a real HAProxy
//! (`option forwardfor`) in front of a real `demo-server`: with `--trusted-proxy` (the one
//! setting that keys both the overload layer's callers and the per-client limit), the
//! forger cannot make the server tell the honest clients to stop; without it, every caller
//! has the balancer's address and it can.
//!
//! Each client connects to HAProxy from a network of its own on the loopback network
//! (127.0.2.1 to 127.0.21.1 honest, 127.66.0.1 the forger: the overload layer keys callers
//! by their `/24`), so HAProxy forwards each one's address. Every address involved is a
//! private one, so the default trust counts every caller's counter: the forger is a client
//! inside the private network, the case the trusted proxy setting is for (a forger on the
//! Internet is not trusted at all; `overload-signal`'s proxies tests show that).

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use demo_client::fleet::{Balancer, BalancerSettings, find_haproxy};
use demo_client::process::ServerProcess;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use overload_signal::protocol::{Attempt, is_stop_signal};

const HONEST: u8 = 20;
const FORGER: Ipv4Addr = Ipv4Addr::new(127, 66, 0, 1);

#[derive(Debug, Default, Clone, Copy)]
struct Answers {
    ok: u64,
    rejected: u64,
    stopped: u64,
}

/// A client on its own connection from `from`: `per_s` requests a second for `secs`
/// seconds, each claiming attempt `attempt` and, for the forger, a forwarded address of
/// its own choosing.
async fn client(from: Ipv4Addr, to: SocketAddr, attempt: u32, per_s: u64, secs: u64) -> Answers {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::V4(from), 0)).unwrap();
    let stream = socket.connect(to).await.expect("HAProxy accepts");
    let (mut send, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut answers = Answers::default();
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / per_s));
    for i in 0..per_s * secs {
        tick.tick().await;
        let mut req = Request::get("/api")
            .header("host", to.to_string())
            .body(Empty::<Bytes>::new())
            .unwrap();
        Attempt::set(req.headers_mut(), attempt);
        if attempt > 0 {
            req.headers_mut().insert(
                "x-forwarded-for",
                format!("10.{}.0.1", i % 250).parse().unwrap(),
            );
        }
        let Ok(response) = send.send_request(req).await else {
            break;
        };
        let stop = is_stop_signal(response.headers());
        let status = response.status();
        let _ = response.into_body().collect().await;
        if stop {
            answers.stopped += 1;
        } else if status == StatusCode::OK {
            answers.ok += 1;
        } else {
            answers.rejected += 1;
        }
    }
    answers
}

/// The honest clients' answers: 20 clients at 20 requests a second, first tries, against a
/// limit of 10 a second per client; the forger at 100 a second claiming third retries.
async fn storm(trust: bool) -> Vec<Answers> {
    let server = integration_tests::workspace_binary("demo-server");
    let haproxy = find_haproxy(None).expect("haproxy is installed (scripts/test installs it)");
    let mut args: Vec<OsString> = [
        "--model",
        "instant",
        "--rate-limit",
        "10",
        "--burst",
        "10",
        "--key",
        "ip",
        "--quiet",
    ]
    .map(OsString::from)
    .to_vec();
    if trust {
        args.extend(["--trusted-proxy", "127.0.0.1"].map(OsString::from));
    }
    let server = ServerProcess::start(&server, &args, None)
        .await
        .expect("demo-server starts");
    let dir = std::env::temp_dir().join(format!("forger-{}-{trust}", std::process::id()));
    let balancer = Balancer::start(
        &haproxy,
        &dir,
        &BalancerSettings::default(),
        &[server.addr()],
    )
    .await
    .expect("haproxy starts");
    let to = balancer.addr();
    let forger = tokio::spawn(client(FORGER, to, 3, 100, 8));
    let honest: Vec<_> = (0..HONEST)
        .map(|i| tokio::spawn(client(Ipv4Addr::new(127, 0, 2 + i, 1), to, 0, 20, 8)))
        .collect();
    let mut each = Vec::new();
    for h in honest {
        each.push(h.await.unwrap());
    }
    forger.await.unwrap();
    balancer.shutdown().await.unwrap();
    server.shutdown().await.unwrap();
    std::fs::remove_dir_all(&dir).ok();
    each
}

fn total(each: &[Answers]) -> Answers {
    each.iter().fold(Answers::default(), |t, a| Answers {
        ok: t.ok + a.ok,
        rejected: t.rejected + a.rejected,
        stopped: t.stopped + a.stopped,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_haproxy_one_forger_cannot_make_the_server_tell_everyone_to_stop() {
    let run = async {
        let untrusted = storm(false).await;
        let trusted = storm(true).await;
        (untrusted, trusted)
    };
    let (untrusted_each, trusted_each) = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the storms end by themselves");
    let (untrusted, trusted) = (total(&untrusted_each), total(&trusted_each));
    eprintln!("honest clients' answers: untrusted {untrusted:?}, trusted {trusted:?}");
    eprintln!("trusted, per honest client: {trusted_each:?}");
    // The anchor: every request has HAProxy's address, one caller and one limit for all;
    // the forger's claimed retries dominate the window and the honest clients' rejections
    // become the stop signal.
    assert!(
        untrusted.stopped > untrusted.rejected,
        "untrusted: {untrusted:?}, trusted: {trusted:?}"
    );
    // Trusted: each client is keyed by the address HAProxy forwards and limited at 10 a
    // second of its 20. The forger can make the server tell only its own caller class to
    // stop: callers are hashed into 128 classes with a key drawn for each process, so in
    // about one run in seven one of the 20 honest clients shares the forger's class and is
    // told to stop too (overload-signal's `signal` docs say so). Every other honest
    // client's rejections stay plain `429`s. Four or more of the 20 in the forger's one
    // class happen by chance in about one run in 55 000.
    let told_to_stop: Vec<_> = trusted_each.iter().filter(|a| a.stopped > 0).collect();
    assert!(
        told_to_stop.len() <= 3,
        "more honest clients told to stop than can share the forger's class: {told_to_stop:?}"
    );
    assert!(
        trusted.rejected > u64::from(HONEST) * 8 * 5,
        "trusted: {trusted:?}"
    );
    assert!(
        trusted.ok > u64::from(HONEST) * 8 * 5,
        "trusted: {trusted:?}"
    );
}
