//! Callers behind a load balancer: one setting (`OverloadProtectionLayerBuilder::
//! trusted_proxies`) keys both the per-client limit and the overload layer's callers by the
//! client address the balancer forwards.
//!
//! Every request here comes from the balancer's address (a `SocketAddr` extension, as a
//! server puts it) with the client it saw appended to `X-Forwarded-For`, as HAProxy's
//! `option forwardfor` does. Time is tokio's, paused.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use overload_signal::protocol::{self, Attempt};
use overload_signal::{OverloadSignalLayer, Trust};
use ratelimit_layer::key::{ClientIp, ForwardedHeader, TrustedProxies};
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tower::{Layer, Service, ServiceExt, service_fn};

const BALANCER: SocketAddr =
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)), 41_000);
const FORGER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 66));

fn balancer() -> TrustedProxies {
    TrustedProxies::new(
        ForwardedHeader::XForwardedFor,
        ["10.0.0.2".parse().unwrap()],
    )
    .unwrap()
}

fn through_balancer(client: IpAddr, claimed: Option<&str>, attempt: u32) -> Request<String> {
    let mut req = Request::new(String::new());
    Attempt::set(req.headers_mut(), attempt);
    if let Some(claimed) = claimed {
        req.headers_mut()
            .append("x-forwarded-for", claimed.parse().unwrap());
    }
    req.headers_mut()
        .append("x-forwarded-for", client.to_string().parse().unwrap());
    req.extensions_mut().insert(BALANCER);
    req
}

/// 5 req/s per client, bursts of 5: keyed by `ClientIp::new()`, the default extractor.
fn per_client_limit(client_ip: ClientIp) -> RateLimitLayer {
    RateLimitLayer::builder(TokenBucket::builder(5).burst(5).build().unwrap())
        .key_by_client_ip(client_ip)
        .build()
        .unwrap()
}

#[derive(Debug, Default)]
struct Honest {
    ok: u64,
    limited: u64,
    stopped: u64,
    /// Which honest clients got at least one stop signal.
    clients_stopped: std::collections::BTreeSet<u8>,
}

/// For 15 s, 40 honest clients (10.1.x.1, each on a network of its own) send 10 first tries a second each, twice their
/// limit; the forger sends 60 a second claiming third retries, each with a fresh address of
/// its own choosing in front of the one the balancer appends.
async fn storm<S>(mut svc: S) -> Honest
where
    S: Service<Request<String>, Response = Response<String>, Error = Infallible>,
{
    let mut honest = Honest::default();
    for _ in 0..15 {
        for tick in 0..10u32 {
            for c in 0..40u8 {
                let req = through_balancer(IpAddr::from([10, 1, c, 1]), None, 0);
                let r = svc.ready().await.unwrap().call(req).await.unwrap();
                match r.status() {
                    StatusCode::OK => honest.ok += 1,
                    _ if protocol::is_stop_signal(r.headers()) => {
                        honest.stopped += 1;
                        honest.clients_stopped.insert(c);
                    }
                    StatusCode::TOO_MANY_REQUESTS => honest.limited += 1,
                    other => panic!("unexpected {other}"),
                }
            }
            for f in 0..6u32 {
                let claimed = format!("198.18.{}.1", (tick * 6 + f) % 250);
                let req = through_balancer(FORGER, Some(&claimed), 3);
                svc.ready().await.unwrap().call(req).await.unwrap();
            }
            tokio::time::advance(Duration::from_millis(100)).await;
        }
    }
    honest
}

fn hello() -> impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone
{
    service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new("ok".to_owned())) })
}

/// Regression (issue 25): the limiter's client key and the overload layer's caller key were
/// separate settings. A team that trusted the balancer in the limit only had an overload
/// layer that saw one caller, the balancer, so one forging client made it tell every client
/// over its own limit to stop retrying: with every caller's counter believed, still so.
/// With the default trust (issue 31), the forger's own address is in the forwarding field,
/// on the Internet: its counters are not read, and nobody is told to stop.
#[tokio::test(start_paused = true)]
async fn trusting_the_balancer_in_the_limit_only_lets_one_forger_stop_everyone() {
    let limit = || {
        per_client_limit(
            ClientIp::builder()
                .trust_proxies(
                    ForwardedHeader::XForwardedFor,
                    ["10.0.0.2".parse().unwrap()],
                )
                .build()
                .unwrap(),
        )
    };
    let signal = OverloadSignalLayer::builder()
        .caller_seed(7)
        .trust(Trust::everyone())
        .build()
        .unwrap();
    let protection = OverloadProtectionLayer::builder(limit())
        .signal(signal)
        .build()
        .unwrap();
    let honest = storm(protection.layer(hello())).await;
    assert!(honest.stopped > honest.limited, "{honest:?}");
    assert_eq!(honest.clients_stopped.len(), 40, "{honest:?}");

    let protection = OverloadProtectionLayer::builder(limit())
        .signal(
            OverloadSignalLayer::builder()
                .caller_seed(7)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let honest = storm(protection.layer(hello())).await;
    assert_eq!(honest.stopped, 0, "{honest:?}");
}

#[tokio::test(start_paused = true)]
async fn one_setting_keys_the_limit_and_the_callers_by_the_forwarded_client() {
    // Every caller's counter believed: the caller classes alone bound the forger.
    let signal = OverloadSignalLayer::builder()
        .caller_seed(7)
        .trust(Trust::everyone())
        .build()
        .unwrap();
    let protection = OverloadProtectionLayer::builder(per_client_limit(ClientIp::new()))
        .signal(signal)
        .trusted_proxies(balancer())
        .build()
        .unwrap();
    assert_eq!(protection.signal().trusted_proxies(), Some(&balancer()));
    let honest = storm(protection.layer(hello())).await;
    // A rejection of a client over its own limit is judged on its own caller class: only a
    // client hashed into the forger's class (of 128) is told to stop with it.
    assert!(honest.clients_stopped.len() <= 1, "{honest:?}");
    // Each client has its own 5 req/s (plus its burst of 5) out of the 10 it sends: the
    // limit is keyed by the forwarded client, not by the balancer (which would admit 5 in
    // all and reject 99 % of the 6 000 requests).
    let admitted = 40 * (5 * 15 + 5);
    assert!(
        honest.ok.abs_diff(admitted) <= 40,
        "admitted {} of 6000, expected about {admitted}: {honest:?}",
        honest.ok
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_past_the_balancer_is_keyed_by_its_own_address() {
    // Five requests with a forged X-Forwarded-For straight from 192.0.2.50 (not the
    // balancer): one bucket, its own, whatever addresses it claims.
    let protection = OverloadProtectionLayer::builder(per_client_limit(ClientIp::new()))
        .trusted_proxies(balancer())
        .build()
        .unwrap();
    let mut svc = protection.layer(hello());
    let mut statuses = Vec::new();
    for i in 0..7 {
        let mut req = Request::new(String::new());
        req.headers_mut()
            .insert("x-forwarded-for", format!("203.0.113.{i}").parse().unwrap());
        req.extensions_mut()
            .insert("192.0.2.50:40000".parse::<SocketAddr>().unwrap());
        statuses.push(svc.ready().await.unwrap().call(req).await.unwrap().status());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        5,
        "{statuses:?}"
    );
}
