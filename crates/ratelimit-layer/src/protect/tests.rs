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

mod levels {
    //! Each request's level, resolved by the protection as users stack it (issue 33).

    use std::sync::{Arc, Mutex};

    use overload_signal::criticality;
    use overload_signal::protocol::Criticality::{
        self, Critical, CriticalPlus, Sheddable, SheddablePlus,
    };
    use overload_signal::protocol::X_REQUEST_CRITICALITY;
    use tower::util::MapRequestLayer;

    use super::*;

    /// What a layer or a handler saw of a request: the level in its extensions and the
    /// current one.
    type Seen = (Option<Criticality>, Option<Criticality>);

    fn seen_now<B>(req: &Request<B>) -> Seen {
        (
            Some(Criticality::of(req.extensions())),
            criticality::current(),
        )
    }

    /// A handler that answers with what it saw, on its first poll and after an await.
    fn echo()
    -> impl tower::Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone
    {
        service_fn(|req: Request<String>| async move {
            let first = seen_now(&req);
            tokio::task::yield_now().await;
            assert_eq!(seen_now(&req), first, "the level holds across awaits");
            let mut response = Response::new(String::new());
            response.extensions_mut().insert(first);
            Ok::<_, Infallible>(response)
        })
    }

    /// A request from `peer` claiming `level` (no header for `None`).
    fn claiming(level: Option<&'static str>, peer: [u8; 4]) -> Request<String> {
        let mut req = Request::new(String::new());
        if let Some(level) = level {
            req.headers_mut()
                .insert(X_REQUEST_CRITICALITY, http::HeaderValue::from_static(level));
        }
        req.extensions_mut()
            .insert(std::net::SocketAddr::from((peer, 40_000)));
        req
    }

    const LOCAL: [u8; 4] = [127, 0, 0, 1];
    const PUBLIC: [u8; 4] = [203, 0, 113, 9];

    /// A token bucket of `n` tokens that never refills, with a layer before it that notes
    /// what it saw of each request: what the limit reads.
    // NOTE: the probe's closure type can only be named as `impl Fn`, which a type alias
    // cannot hold on stable Rust.
    #[allow(clippy::type_complexity)]
    fn probed_limit(
        n: u32,
    ) -> (
        (
            MapRequestLayer<impl Fn(Request<String>) -> Request<String> + Clone>,
            RateLimitLayer,
        ),
        Arc<Mutex<Vec<Seen>>>,
    ) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let probe = MapRequestLayer::new(move |req: Request<String>| {
            log.lock().unwrap().push(seen_now(&req));
            req
        });
        let limit = RateLimitLayer::builder(TokenBucket::new(n).unwrap())
            .clock(FakeClock::new())
            .build()
            .unwrap();
        ((probe, limit), seen)
    }

    /// What the handler behind `svc` saw of `req`, or `None` when it did not run.
    async fn handled<S>(svc: &S, req: Request<String>) -> Option<Seen>
    where
        S: tower::Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
    {
        let response = svc.clone().oneshot(req).await.unwrap();
        response.extensions().get::<Seen>().copied()
    }

    /// The level of each request, with the defaults, with and without a deadline layer:
    /// claimed, capped for a caller on the Internet, the default for junk and for none.
    #[tokio::test(start_paused = true)]
    async fn the_handler_and_the_limit_see_the_level_with_the_defaults() {
        let (limit, seen) = probed_limit(100);
        let plain = OverloadProtectionLayer::new(limit).layer(echo());
        let (limit, seen_deadline) = probed_limit(100);
        let with_deadline = OverloadProtectionLayer::builder(limit)
            .deadline(DeadlineLayer::new())
            .build()
            .unwrap()
            .layer(echo());
        let cases = [
            (Some("sheddable"), LOCAL, Sheddable),
            (Some("sheddable-plus"), PUBLIC, SheddablePlus),
            (Some("critical-plus"), LOCAL, CriticalPlus),
            (Some("critical-plus"), PUBLIC, Critical),
            (Some("Critical!!"), LOCAL, Critical),
            (Some(""), PUBLIC, Critical),
            (None, LOCAL, Critical),
        ];
        for (claim, peer, level) in cases {
            let both = Some((Some(level), Some(level)));
            assert_eq!(
                handled(&plain, claiming(claim, peer)).await,
                both,
                "{claim:?}"
            );
            assert_eq!(
                handled(&with_deadline, claiming(claim, peer)).await,
                both,
                "{claim:?}, with a deadline layer"
            );
        }
        let expected: Vec<Seen> = cases.iter().map(|c| (Some(c.2), Some(c.2))).collect();
        assert_eq!(*seen.lock().unwrap(), expected, "the limit saw the same");
        assert_eq!(*seen_deadline.lock().unwrap(), expected);
        assert_eq!(criticality::current(), None, "nothing left behind");
    }

    /// A rejected request's level was resolved too: the limit saw it before refusing.
    #[tokio::test(start_paused = true)]
    async fn the_level_is_resolved_before_the_limit() {
        let (limit, seen) = probed_limit(1);
        let svc = OverloadProtectionLayer::new(limit).layer(echo());
        assert!(
            handled(&svc, claiming(Some("sheddable"), LOCAL))
                .await
                .is_some()
        );
        let rejected = svc
            .clone()
            .oneshot(claiming(Some("sheddable-plus"), LOCAL))
            .await
            .unwrap();
        assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                (Some(Sheddable), Some(Sheddable)),
                (Some(SheddablePlus), Some(SheddablePlus))
            ]
        );
    }

    /// The protection's `trust` caps the level of the callers it does not trust, and its
    /// `criticality` settings are the server's (a default level of its own).
    #[tokio::test(start_paused = true)]
    async fn the_protections_trust_caps_untrusted_callers() {
        let (limit, _) = probed_limit(100);
        let nobody = OverloadProtectionLayer::builder(limit)
            .deadline(DeadlineLayer::new())
            .trust(Trust::nobody())
            .build()
            .unwrap();
        assert!(nobody.criticality().trust_setting().is_some());
        let svc = nobody.layer(echo());
        let level = |l| Some((Some(l), Some(l)));
        assert_eq!(
            handled(&svc, claiming(Some("critical-plus"), LOCAL)).await,
            level(Critical)
        );
        assert_eq!(
            handled(&svc, claiming(Some("sheddable-plus"), LOCAL)).await,
            level(SheddablePlus)
        );

        let (limit, _) = probed_limit(100);
        let batch = OverloadProtectionLayer::builder(limit)
            .criticality(
                CriticalityLayer::builder()
                    .default_level(Sheddable)
                    .untrusted_max(SheddablePlus)
                    .build()
                    .unwrap(),
            )
            .trust(Trust::everyone())
            .build()
            .unwrap();
        let svc = batch.layer(echo());
        assert_eq!(
            handled(&svc, claiming(None, PUBLIC)).await,
            level(Sheddable)
        );
        assert_eq!(
            handled(&svc, claiming(Some("critical-plus"), PUBLIC)).await,
            level(CriticalPlus),
            "everyone is trusted"
        );
    }

    /// A level the server's own code put in the request wins over the header.
    #[tokio::test(start_paused = true)]
    async fn a_level_already_in_the_request_is_kept() {
        let (limit, _) = probed_limit(100);
        let svc = OverloadProtectionLayer::new(limit).layer(echo());
        let mut req = claiming(Some("critical-plus"), LOCAL);
        req.extensions_mut().insert(Sheddable);
        assert_eq!(
            handled(&svc, req).await,
            Some((Some(Sheddable), Some(Sheddable)))
        );
    }

    /// Settings given twice are refused, not replaced (as the trust and the proxies are).
    #[test]
    fn criticality_and_trust_set_twice_are_refused() {
        let own_trust = CriticalityLayer::builder()
            .trust(Trust::everyone())
            .build()
            .unwrap();
        let err = OverloadProtectionLayer::builder(())
            .criticality(own_trust)
            .trust(Trust::nobody())
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "trust");
        assert!(
            err.to_string()
                .contains("criticality layer given to `criticality`"),
            "{err}"
        );

        let resolving = OverloadSignalLayer::new().with_criticality(CriticalityLayer::new());
        let err = OverloadProtectionLayer::builder(())
            .signal(resolving)
            .criticality(CriticalityLayer::new())
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "criticality");
        assert_eq!(err.kind(), crate::ConfigErrorKind::Conflict);
        // Either one alone is kept.
        let named = CriticalityLayer::builder().name("edge").build().unwrap();
        let theirs = OverloadProtectionLayer::builder(())
            .signal(OverloadSignalLayer::new().with_criticality(named.clone()))
            .build()
            .unwrap();
        assert_eq!(theirs.criticality().name().as_str(), "edge");
        let ours = OverloadProtectionLayer::builder(())
            .criticality(named)
            .build()
            .unwrap();
        assert_eq!(ours.criticality().name().as_str(), "edge");
        assert_eq!(
            ours.signal()
                .criticality()
                .map(|c| c.name().as_str().to_owned())
                .as_deref(),
            Some("edge")
        );
        assert!(format!("{ours:?}").contains("criticality: CriticalityLayer"));
    }
}
