//! The protection as users stack it.

use std::convert::Infallible;

use http::{Request, Response, StatusCode};
use overload_signal::protocol::{self, Attempt};
use overload_signal::{OverloadSignalLayer, StopRule};
use tower::{Layer, ServiceBuilder, ServiceExt, service_fn};

use super::*;
use crate::clock::FakeClock;
use crate::{RateLimitLayer, TokenBucket};

/// A retry from a caller on this host (whose counter the default trust counts).
fn retry() -> Request<String> {
    let mut req = Request::new(String::new());
    Attempt::set(req.headers_mut(), 2);
    req.extensions_mut()
        .insert(std::net::SocketAddr::from(([127, 0, 0, 1], 40_000)));
    req
}

/// One request admitted, ever; the stop signal from the fifth request in the window.
fn protection() -> OverloadProtectionLayer<RateLimitLayer> {
    let limit = RateLimitLayer::builder(TokenBucket::new(1).unwrap())
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let rule = StopRule::builder()
        .retry_share(0.1)
        .min_requests(5)
        .build()
        .unwrap();
    OverloadProtectionLayer::builder(limit)
        .signal(OverloadSignalLayer::builder().rule(rule).build().unwrap())
        .build()
        .unwrap()
}

async fn statuses<S>(svc: S) -> Vec<StatusCode>
where
    S: tower::Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
{
    let mut out = Vec::new();
    for _ in 0..6 {
        out.push(svc.clone().oneshot(retry()).await.unwrap().status());
    }
    out
}

fn hello()
-> impl tower::Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone {
    service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new("hi".into())) })
}

#[tokio::test(start_paused = true)]
async fn the_overload_layer_is_outside_however_the_stack_nests() {
    use StatusCode as S;
    let expected = [
        S::OK,
        S::TOO_MANY_REQUESTS,
        S::TOO_MANY_REQUESTS,
        S::TOO_MANY_REQUESTS,
        S::SERVICE_UNAVAILABLE,
        S::SERVICE_UNAVAILABLE,
    ];
    // Directly.
    assert_eq!(statuses(protection().layer(hello())).await, expected);
    // In a ServiceBuilder, first or last: it is one layer.
    let svc = ServiceBuilder::new()
        .layer(protection())
        .layer(tower::layer::layer_fn(|s| s))
        .service(hello());
    assert_eq!(statuses(svc).await, expected);
    // The trap it removes: the same two layers, the overload layer inside.
    let p = protection();
    let wrong = ServiceBuilder::new()
        .layer(p.limit().clone())
        .layer(p.signal().clone())
        .service(hello());
    let got = statuses(wrong).await;
    assert!(!got.contains(&S::SERVICE_UNAVAILABLE), "{got:?}");
    assert_eq!(
        p.signal().histogram().snapshot().total(),
        1,
        "it saw one request"
    );
}

#[tokio::test(start_paused = true)]
async fn several_limiting_layers_go_in_as_a_tuple() {
    // An outer limit that rejects nothing, and the token bucket inside it.
    let p = protection();
    let both = OverloadProtectionLayer::builder((tower::layer::layer_fn(|s| s), p.limit().clone()))
        .signal(p.signal().clone())
        .build()
        .unwrap();
    let got = statuses(both.layer(hello())).await;
    assert_eq!(got.last(), Some(&StatusCode::SERVICE_UNAVAILABLE));
    let r = both.layer(hello()).oneshot(retry()).await.unwrap();
    assert!(protocol::is_stop_signal(r.headers()));
    let _: &OverloadSignalLayer = both.signal();
}

/// With a deadline layer, an expired request is answered `504` between the two: it
/// spends no token of the limit, and the overload layer still records it.
#[tokio::test(start_paused = true)]
async fn a_deadline_layer_goes_between_the_overload_layer_and_the_limit() {
    use overload_signal::DeadlineLayer;
    use overload_signal::deadline::RequestDeadline;
    let p = protection();
    let with_deadline = OverloadProtectionLayer::builder(p.limit().clone())
        .signal(p.signal().clone())
        .deadline(DeadlineLayer::new())
        .build()
        .unwrap();
    let svc = with_deadline.layer(hello());
    let mut expired = Request::new(String::new());
    expired
        .extensions_mut()
        .insert(RequestDeadline::at(tokio::time::Instant::now()));
    let r = svc.clone().oneshot(expired).await.unwrap();
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(p.signal().histogram().snapshot().total(), 1, "recorded");
    // The limit's only token is still there for a live request.
    let r = svc.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let _: &DeadlineLayer = with_deadline.deadline();
    assert!(format!("{with_deadline:?}").contains("deadline: DeadlineLayer"));
}

#[test]
fn clone_send_sync_and_debug() {
    fn assert_traits<T: Clone + Send + Sync + 'static>() {}
    assert_traits::<OverloadProtectionLayer<RateLimitLayer>>();
    assert_traits::<OverloadProtectionLayer<RateLimitLayer, TokioClock, DeadlineLayer>>();
    let d = format!("{:?}", protection());
    assert!(
        d.starts_with("OverloadProtectionLayer { signal: OverloadSignalLayer"),
        "{d}"
    );
    assert!(format!("{:?}", OverloadProtectionLayer::builder(())).contains("limit: ()"));
}

/// Regression (issue 30, review item D3): proxies set on this builder silently replaced
/// those set on the overload layer given to `signal`.
#[test]
fn proxies_set_twice_are_refused_not_replaced() {
    use overload_signal::signal::{ForwardedHeader, TrustedProxies};
    let proxies = |ip: &str| {
        TrustedProxies::new(ForwardedHeader::XForwardedFor, [ip.parse().unwrap()]).unwrap()
    };
    let signal = OverloadSignalLayer::builder()
        .trusted_proxies(proxies("10.0.0.2"))
        .build()
        .unwrap();
    let err = OverloadProtectionLayer::builder(())
        .signal(signal.clone())
        .trusted_proxies(proxies("10.0.0.3"))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "trusted_proxies");
    assert_eq!(err.kind(), crate::ConfigErrorKind::Conflict);
    assert!(
        err.to_string().starts_with(
            "trusted_proxies set on this builder (TrustedProxies { header: XForwardedFor"
        ) && err
            .to_string()
            .contains(") and on the overload layer given to `signal` (")
            && err.to_string().ends_with("): set them once"),
        "{err}"
    );
    // Either one alone is kept.
    let theirs = OverloadProtectionLayer::builder(())
        .signal(signal)
        .build()
        .unwrap();
    assert!(theirs.signal().trusted_proxies().is_some());
    let ours = OverloadProtectionLayer::builder(())
        .trusted_proxies(proxies("10.0.0.3"))
        .build()
        .unwrap();
    assert!(ours.signal().trusted_proxies().is_some());
}

/// A layer that may decide in Redis (`RateLimitLayer<Remote>`, here a local limit
/// converted to that type, as a program that chooses at run time holds it) goes inside
/// the overload layer the same way.
#[cfg(feature = "redis")]
#[tokio::test(start_paused = true)]
async fn a_remote_kind_of_limit_goes_inside_too() {
    use crate::Remote;
    fn assert_traits<T: Clone + Send + Sync + 'static>() {}
    assert_traits::<OverloadProtectionLayer<RateLimitLayer<Remote>>>();
    let local = protection();
    let remote: RateLimitLayer<Remote> = local.limit().clone().into();
    let p = OverloadProtectionLayer::builder(remote)
        .signal(local.signal().clone())
        .build()
        .unwrap();
    let got = statuses(p.layer(hello())).await;
    assert_eq!(got.first(), Some(&StatusCode::OK));
    assert_eq!(got.last(), Some(&StatusCode::SERVICE_UNAVAILABLE));
}

/// The protection's trust reaches both layers, and is refused when one of them has its
/// own (issue 31: one trust setting for the server, set once).
#[tokio::test(start_paused = true)]
async fn the_trust_setting_reaches_both_layers_once() {
    let limit = || {
        RateLimitLayer::builder(TokenBucket::new(1).unwrap())
            .clock(FakeClock::new())
            .build()
            .unwrap()
    };
    let rule = || {
        StopRule::builder()
            .retry_share(0.1)
            .min_requests(5)
            .build()
            .unwrap()
    };
    let nobody = OverloadProtectionLayer::builder(limit())
        .signal(OverloadSignalLayer::builder().rule(rule()).build().unwrap())
        .deadline(DeadlineLayer::new())
        .trust(Trust::nobody())
        .build()
        .unwrap();
    assert!(nobody.signal().trust().is_some());
    assert!(nobody.deadline().trust().is_some());
    // This host's retries no longer count: plain rejections, never the stop signal.
    let got = statuses(nobody.layer(hello())).await;
    assert!(!got.contains(&StatusCode::SERVICE_UNAVAILABLE), "{got:?}");

    let err = OverloadProtectionLayer::builder(limit())
        .signal(
            OverloadSignalLayer::builder()
                .trust(Trust::everyone())
                .build()
                .unwrap(),
        )
        .trust(Trust::nobody())
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "trust");
    assert!(err.to_string().contains("set it once"), "{err}");
    let err = OverloadProtectionLayer::builder(limit())
        .deadline(
            DeadlineLayer::builder()
                .trust(Trust::everyone())
                .build()
                .unwrap(),
        )
        .trust(Trust::nobody())
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "trust");
    // Without a deadline layer, the trust goes to the overload layer alone.
    let alone = OverloadProtectionLayer::builder(limit())
        .trust(Trust::everyone())
        .build()
        .unwrap();
    assert!(alone.signal().trust().is_some());
}
