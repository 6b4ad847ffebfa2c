//! Callers behind a load balancer: the layer's trusted proxies.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use super::*;

/// Every request reaches the server from the balancer.
const BALANCER: SocketAddr =
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)), 50_000);

/// A request that came through the balancer: `client` is what the balancer appended to
/// `X-Forwarded-For`, after whatever the client itself sent (`claimed`).
fn through_balancer(attempt: Option<u32>, claimed: Option<&str>, client: IpAddr) -> Request<Body> {
    let mut req = request(attempt);
    if let Some(claimed) = claimed {
        req.headers_mut()
            .append("x-forwarded-for", claimed.parse().unwrap());
    }
    req.headers_mut()
        .append("x-forwarded-for", client.to_string().parse().unwrap());
    req.extensions_mut().insert(BALANCER);
    req
}

fn balancer() -> TrustedProxies {
    TrustedProxies::new(
        ForwardedHeader::XForwardedFor,
        ["10.0.0.2".parse().unwrap()],
    )
    .unwrap()
}

/// The storm of `forged_storm`, through the balancer: 70 honest clients (10.1.x.1) send
/// first tries; the forger (198.51.100.66) claims third retries and, to look like many
/// callers, a fresh `X-Forwarded-For` network of its own on every request.
async fn forged_storm_behind_a_balancer<S>(svc: &mut S) -> (Answers, Answers)
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    let (mut honest, mut forger) = (Answers::default(), Answers::default());
    for _ in 0..15 {
        for i in 0..760u32 {
            if i % 38 < 3 {
                let claimed = format!("198.18.{}.1", i % 250);
                let r = one(svc, through_balancer(Some(3), Some(&claimed), FORGER.ip())).await;
                forger.count(&r);
            } else {
                let client = IpAddr::from([10, 1, (i % 70) as u8, 1]);
                let r = one(svc, through_balancer(Some(0), None, client)).await;
                honest.count(&r);
            }
        }
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    (honest, forger)
}

#[tokio::test(start_paused = true)]
async fn behind_a_trusted_balancer_one_forger_cannot_make_the_server_say_stop() {
    // Every counter believed, the balancer not trusted: every request is keyed by the
    // balancer's address, one class, and the forger decides for everyone (the issue's
    // "every request reaches the servers from the balancer's address").
    let layer = OverloadSignalLayer::builder()
        .caller_seed(7)
        .trust(Trust::everyone())
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    let (honest, _) = forged_storm_behind_a_balancer(&mut svc).await;
    assert!(honest.stopped > honest.rejected, "{honest:?}");

    // The balancer trusted: keyed by the forwarded client, the forger is one caller of 71,
    // whatever it writes in its own X-Forwarded-For, even with every counter believed.
    let layer = OverloadSignalLayer::builder()
        .caller_seed(7)
        .trust(Trust::everyone())
        .trusted_proxies(balancer())
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    let (honest, forger) = forged_storm_behind_a_balancer(&mut svc).await;
    assert_eq!(honest.stopped, 0, "{honest:?}");
    assert_eq!(honest.rejected, 15 * 700);
    assert_eq!(forger.stopped, 0, "{forger:?}");

    // The default trust, with or without the balancer trusted: the forger's address is on
    // the Internet, so its counters are not read at all.
    for proxies in [None, Some(balancer())] {
        let builder = OverloadSignalLayer::builder().caller_seed(7);
        let builder = match proxies {
            Some(p) => builder.trusted_proxies(p),
            None => builder,
        };
        let layer = builder.build().unwrap();
        let mut svc = tower::Layer::layer(&layer, answering(http_429));
        let (honest, forger) = forged_storm_behind_a_balancer(&mut svc).await;
        assert_eq!(
            (honest.stopped, forger.stopped),
            (0, 0),
            "{honest:?} {forger:?}"
        );
        assert_eq!(layer.histogram().snapshot().retries(), 0);
    }
}

/// Regression (issue 31, finding 6): the mistake the setting's rule against `/0` guards
/// against, made with two halves that cover every IPv4 address, was accepted; trusting the
/// network the clients live in let the forger's own X-Forwarded-For choose its key, a new
/// caller on every request (this test then showed the honest clients told to stop). It is
/// refused now, and so is one half alone; the balancer's own address is accepted.
#[tokio::test(start_paused = true)]
async fn trusting_the_clients_network_too_is_refused() {
    let halves = ["0.0.0.0/1".parse().unwrap(), "128.0.0.0/1".parse().unwrap()];
    let err = TrustedProxies::new(ForwardedHeader::XForwardedFor, halves).unwrap_err();
    assert_eq!(err.field(), "proxies");
    assert!(err.to_string().contains("any client"), "{err}");
    let half = ["0.0.0.0/1".parse().unwrap()];
    assert!(TrustedProxies::new(ForwardedHeader::XForwardedFor, half).is_err());
    // The balancer alone: the forger is one caller among 71.
    let layer = OverloadSignalLayer::builder()
        .caller_seed(7)
        .trust(Trust::everyone())
        .trusted_proxies(balancer())
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    let (honest, _) = forged_storm_behind_a_balancer(&mut svc).await;
    assert_eq!(honest.stopped, 0, "{honest:?}");
}

#[tokio::test]
async fn the_resolved_client_is_left_in_the_request_for_the_layers_inside() {
    let seen: Arc<Mutex<Vec<Option<IpAddr>>>> = Arc::default();
    let log = Arc::clone(&seen);
    let inner = service_fn(move |req: Request<Body>| {
        log.lock().unwrap().push(client_addr(req.extensions()));
        async { Ok::<_, Infallible>(Response::new(Body::default())) }
    });
    let layer = OverloadSignalLayer::builder()
        .trusted_proxies(balancer())
        .build()
        .unwrap();
    assert_eq!(layer.trusted_proxies(), Some(&balancer()));
    let mut svc = tower::Layer::layer(&layer, inner);
    let client: IpAddr = "203.0.113.8".parse().unwrap();
    one(&mut svc, through_balancer(None, Some("1.2.3.4"), client)).await;
    // A client that connects past the balancer with its own header: its peer address.
    let mut direct = request(None);
    direct
        .headers_mut()
        .insert("x-forwarded-for", "1.2.3.4".parse().unwrap());
    direct.extensions_mut().insert(FORGER);
    one(&mut svc, direct).await;
    assert_eq!(*seen.lock().unwrap(), vec![Some(client), Some(FORGER.ip())]);

    // A layer built without proxies gets them afterwards, its histogram shared.
    let plain = OverloadSignalLayer::new();
    let trusting = plain.clone().with_trusted_proxies(balancer());
    assert!(plain.trusted_proxies().is_none());
    let mut svc = tower::Layer::layer(&trusting, answering(|| status(StatusCode::OK)));
    one(&mut svc, through_balancer(None, None, client)).await;
    assert_eq!(plain.histogram().snapshot().total(), 1);
}
