//! The layer's contract, with a fake clock and plain Tower services.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use overload_signal::protocol::{GRPC_RETRY_PUSHBACK_MS, RATELIMIT, RATELIMIT_POLICY, grpc_status};
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::key::{ClientIp, MissingKey};
use ratelimit_layer::{
    ConfigErrorKind, FixedWindow, Limiter, RateLimit, RateLimitLayer, SlidingWindow, TokenBucket,
};
use tower::util::BoxService;
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

use crate::support;

type Calls = Arc<AtomicUsize>;

fn bucket(rate: u32, burst: u32) -> TokenBucket {
    TokenBucket::builder(rate).burst(burst).build().unwrap()
}

fn counting_service(
    calls: &Calls,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone + use<>
{
    let calls = Arc::clone(calls);
    service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new("hello".to_owned())) }
    })
}

fn request() -> Request<String> {
    Request::new(String::new())
}

fn from(peer: &str) -> Request<String> {
    let mut req = request();
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

#[tokio::test]
async fn rejects_above_the_rate_without_calling_the_inner_service() {
    let clock = FakeClock::new();
    let layer = RateLimitLayer::builder(bucket(10, 5))
        .clock(clock.clone())
        .build()
        .unwrap();
    let calls = Calls::default();
    let svc = layer.layer(counting_service(&calls));
    for _ in 0..5 {
        let res = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get(RATELIMIT).is_none(), "off by default");
    }
    let res = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()[http::header::RETRY_AFTER], "1");
    assert_eq!(res.headers()[RATELIMIT_POLICY], "\"default\";q=10;w=1");
    assert_eq!(res.headers()[RATELIMIT], "\"default\";r=0;t=1");
    assert_eq!(res.body(), "", "rejections have the default body");
    assert_eq!(calls.load(Ordering::SeqCst), 5);

    clock.advance(Duration::from_millis(100));
    let res = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}

/// The `RateLimit-Policy` value never changes, so it is formatted once and every response
/// shares its bytes: a value formatted per response would live in its own buffer.
#[tokio::test]
async fn the_policy_field_is_formatted_once() {
    let layer = RateLimitLayer::builder(bucket(10, 1))
        .clock(FakeClock::new())
        .admitted_headers(true)
        .build()
        .unwrap();
    let svc = layer.layer(counting_service(&Calls::default()));
    let admitted = svc.clone().oneshot(request()).await.unwrap();
    let first = svc.clone().oneshot(request()).await.unwrap();
    let second = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(first.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    let bytes = |res: &Response<String>| res.headers()[RATELIMIT_POLICY].as_bytes().as_ptr();
    assert_eq!(first.headers()[RATELIMIT_POLICY], "\"default\";q=10;w=1");
    assert_eq!(bytes(&first), bytes(&second));
    assert_eq!(bytes(&first), bytes(&admitted));
    // The `RateLimit` field changes with the quota left, so each response has its own.
    assert_ne!(
        first.headers()[RATELIMIT].as_bytes().as_ptr(),
        second.headers()[RATELIMIT].as_bytes().as_ptr()
    );
}

#[tokio::test]
async fn grpc_requests_get_resource_exhausted_with_pushback() {
    let layer = RateLimitLayer::builder(bucket(10, 1))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let calls = Calls::default();
    let svc = layer.layer(counting_service(&calls));
    let grpc = || {
        Request::builder()
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(String::new())
            .unwrap()
    };
    assert_eq!(
        grpc_status(svc.clone().oneshot(grpc()).await.unwrap().headers()),
        None
    );
    let res = svc.clone().oneshot(grpc()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(grpc_status(res.headers()), Some(8));
    assert_eq!(res.headers()[GRPC_RETRY_PUSHBACK_MS], "100");
    assert!(res.headers().get(http::header::RETRY_AFTER).is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn admitted_responses_carry_the_fields_when_asked() {
    let layer = RateLimitLayer::builder(
        FixedWindow::builder(3)
            .window(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
    .clock(FakeClock::new())
    .name("api")
    .admitted_headers(true)
    .build()
    .unwrap();
    let svc = layer.layer(counting_service(&Calls::default()));
    let res = svc.oneshot(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()[RATELIMIT_POLICY], "\"api\";q=3;w=10");
    assert_eq!(res.headers()[RATELIMIT], "\"api\";r=2;t=10");
}

#[tokio::test]
async fn keyed_by_client_ip() {
    let layer = RateLimitLayer::builder(bucket(1, 2))
        .clock(FakeClock::new())
        .key_by_client_ip(ClientIp::new())
        .build()
        .unwrap();
    let calls = Calls::default();
    let svc = layer.layer(counting_service(&calls));
    let status = |req| {
        let svc = svc.clone();
        async move { svc.oneshot(req).await.unwrap().status() }
    };
    assert_eq!(status(from("192.0.2.1:1000")).await, StatusCode::OK);
    assert_eq!(status(from("192.0.2.1:1001")).await, StatusCode::OK);
    assert_eq!(
        status(from("192.0.2.1:1002")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another client has its own bucket.
    assert_eq!(status(from("192.0.2.2:1000")).await, StatusCode::OK);
    // A spoofed X-Forwarded-For from an untrusted peer changes nothing.
    let mut spoofed = from("192.0.2.1:1003");
    spoofed
        .headers_mut()
        .insert("x-forwarded-for", HeaderValue::from_static("198.51.100.9"));
    assert_eq!(status(spoofed).await, StatusCode::TOO_MANY_REQUESTS);
    // A request without a peer address: the server does not provide it, which the default
    // missing-key policy for client IPs answers with 500, without calling the service.
    assert_eq!(status(request()).await, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn keyed_by_header() {
    let layer = RateLimitLayer::builder(bucket(1, 1))
        .clock(FakeClock::new())
        .key_by_header(http::HeaderName::from_static("x-api-key"))
        .build()
        .unwrap();
    let svc = layer.layer(counting_service(&Calls::default()));
    let with_key = |k: &'static str| {
        Request::builder()
            .header("x-api-key", k)
            .body(String::new())
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(with_key("a")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(with_key("b")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(with_key("a")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A regression test of issue 31's finding 9: `HeaderKey` dropped a value over 256 bytes,
/// so a limit keyed by `Authorization` took every request with a JWT (500 to 1 500 bytes)
/// for one without a key: two clients with different 1 200-byte bearer tokens shared one
/// limit (the missing-key policy's), and a third request of the second client was rejected
/// by the first client's use. Now a long value is keyed by its digest: each token is a key
/// of its own, limited by its own quota, and no request counts as missing its key.
#[tokio::test]
async fn a_long_bearer_token_is_a_key_of_its_own() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let layer = RateLimitLayer::builder(bucket(1, 2))
        .clock(FakeClock::new())
        .key_by_header(http::header::AUTHORIZATION)
        .name("jwt")
        .build()
        .unwrap();
    let svc = layer.layer(counting_service(&Calls::default()));
    // Two tokens of 1 200 bytes that differ in their last byte only.
    let token = |last: char| format!("Bearer {}{last}", "e".repeat(1_192));
    assert_eq!(token('A').len(), 1_200);
    let bearer = |token: &str| {
        Request::builder()
            .header(http::header::AUTHORIZATION, token)
            .body(String::new())
            .unwrap()
    };
    let mut statuses = Vec::new();
    for t in [
        token('A'),
        token('A'),
        token('B'),
        token('B'),
        token('A'),
        token('B'),
    ] {
        statuses.push(
            svc.clone()
                .oneshot(bearer(&t))
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    println!("statuses: {statuses:?}");
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 429, 429],
        "each token has its own burst of 2"
    );
    let missing: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "ratelimit_layer_missing_key_total")
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    assert_eq!(missing, 0, "no request counted as missing its key");
}

/// A regression test of issue 31's finding 3, for the local map: at the key cap every new
/// key was decided against one overflow limit with one key's rate, so one client minting
/// keys pushed every new client of the server into one key's quota.
///
/// The attack: 2 000 new /64 keys a second, all from one IPv6 /48 (which holds 65 536 of
/// them), against a map of 1 000 keys; beside it, one honest new client on another network
/// arrives once the map is full. Before the fix, the honest client's 3 requests met the
/// overflow limit the flood had spent: all 3 rejected. Now each network's new keys past the
/// cap share an overflow limit of that network's own: the honest client is admitted at its
/// own key's quota (a burst of 3, then rejected), and the flood spends only its own.
#[tokio::test]
async fn a_network_minting_keys_cannot_push_new_clients_of_other_networks_out() {
    let clock = FakeClock::new();
    let layer = RateLimitLayer::builder(
        TokenBucket::builder(1)
            .period(Duration::from_secs(3_600))
            .burst(3)
            .build()
            .unwrap(),
    )
    .clock(clock.clone())
    .key_by_client_ip(ClientIp::new())
    .max_keys(1_000)
    .build()
    .unwrap();
    let svc = layer.layer(counting_service(&Calls::default()));
    let status = |peer: String| {
        let svc = svc.clone();
        async move { svc.oneshot(from(&peer)).await.unwrap().status() }
    };
    // 2 000 new /64s a second of 2001:db8:bad::/48, for two seconds.
    let mut flood_admitted = 0;
    let mut honest = Vec::new();
    for i in 0..4_000u32 {
        clock.advance(Duration::from_micros(500));
        let peer = format!("[2001:db8:bad:{:x}::1]:4000", i % 65_536);
        if status(peer).await == StatusCode::OK {
            flood_admitted += 1;
        }
        // The honest client, on 2001:db8:1::/48, starts once the map is full.
        if i >= 3_000 && i % 200 == 0 {
            honest.push(status("[2001:db8:1:1::7]:5000".to_owned()).await.as_u16());
        }
    }
    println!("flood admitted: {flood_admitted} of 4000; honest client: {honest:?}");
    assert_eq!(
        honest,
        [200, 200, 200, 429, 429],
        "the honest client is admitted at its own key's quota (a burst of 3)"
    );
    // The flood: the map's 1 000 keys (3 requests' worth each, spent one at a time) and its
    // network's one overflow burst, nothing more.
    assert!(
        flood_admitted <= 1_024 + 3,
        "flood admitted {flood_admitted}"
    );
}

#[tokio::test]
async fn weighted_requests() {
    let layer = RateLimitLayer::builder(bucket(10, 10))
        .clock(FakeClock::new())
        .cost_by(|parts| if parts.uri.path() == "/heavy" { 6 } else { 1 })
        .build()
        .unwrap();
    let svc = layer.layer(counting_service(&Calls::default()));
    let to = |path: &str| Request::builder().uri(path).body(String::new()).unwrap();
    assert_eq!(
        svc.clone().oneshot(to("/heavy")).await.unwrap().status(),
        StatusCode::OK
    );
    let res = svc.clone().oneshot(to("/heavy")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()[RATELIMIT], "\"default\";r=4;t=1");
    for _ in 0..4 {
        assert_eq!(
            svc.clone().oneshot(to("/light")).await.unwrap().status(),
            StatusCode::OK
        );
    }
}

/// Regression (issue 30, finding 7): a request whose cost exceeds the limiter's capacity
/// (its burst, or its quota) was answered `429` with `Retry-After`, an invitation to retry a
/// request that can never be admitted. It is answered `413 Content Too Large` now, with the
/// `RateLimit-Policy` field (the quota it exceeds) and neither `Retry-After` nor `RateLimit`;
/// gRPC `INVALID_ARGUMENT`, trailers-only, no pushback; marked `ExceedsCapacity`, whatever
/// the algorithm, global or keyed.
#[tokio::test]
async fn a_request_too_heavy_for_the_limit_is_answered_413_never_429() {
    use overload_signal::signal::{Rejection, RejectionScope};
    fn layers() -> Vec<(&'static str, RateLimitLayer)> {
        let costly = |parts: &http::request::Parts| {
            parts
                .headers
                .get("x-cost")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        };
        let bucket = TokenBucket::builder(5)
            .period(Duration::from_secs(3))
            .build()
            .unwrap();
        let fixed = FixedWindow::builder(5)
            .window(Duration::from_secs(3))
            .build()
            .unwrap();
        let sliding = SlidingWindow::builder(5)
            .window(Duration::from_secs(3))
            .build()
            .unwrap();
        vec![
            (
                "token bucket",
                RateLimitLayer::builder(bucket.clone())
                    .clock(FakeClock::new())
                    .cost_by(costly)
                    .build()
                    .unwrap(),
            ),
            (
                "keyed token bucket",
                RateLimitLayer::builder(bucket)
                    .clock(FakeClock::new())
                    .key_by_client_ip(ClientIp::new())
                    .missing_key(MissingKey::Shared)
                    .cost_by(costly)
                    .build()
                    .unwrap(),
            ),
            (
                "fixed window",
                RateLimitLayer::builder(fixed)
                    .clock(FakeClock::new())
                    .cost_by(costly)
                    .build()
                    .unwrap(),
            ),
            (
                "sliding window",
                RateLimitLayer::builder(sliding)
                    .clock(FakeClock::new())
                    .cost_by(costly)
                    .build()
                    .unwrap(),
            ),
        ]
    }
    let costing = |cost: u32, grpc: bool| {
        let mut req = from("192.0.2.1:1");
        req.headers_mut().insert("x-cost", HeaderValue::from(cost));
        if grpc {
            req.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
        }
        req
    };
    let kind = |r: &Response<String>| r.extensions().get::<Rejection>().map(|m| m.kind().as_str());
    for (algorithm, layer) in layers() {
        let calls = Calls::default();
        let svc = layer.layer(counting_service(&calls));
        // Above the capacity of 5, on a full limit: never admissible.
        let res = svc.clone().oneshot(costing(6, false)).await.unwrap();
        assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE, "{algorithm}");
        assert_eq!(
            res.headers()[RATELIMIT_POLICY],
            "\"default\";q=5;w=3",
            "{algorithm}"
        );
        assert!(
            res.headers().get(http::header::RETRY_AFTER).is_none(),
            "{algorithm}"
        );
        assert!(res.headers().get(RATELIMIT).is_none(), "{algorithm}");
        assert_eq!(kind(&res), Some("exceeds_capacity"), "{algorithm}");
        let marker = res.extensions().get::<Rejection>().unwrap();
        assert_eq!(marker.retry_after(), None, "{algorithm}");
        assert_eq!(marker.scope(), RejectionScope::Caller, "{algorithm}");
        let res = svc.clone().oneshot(costing(u32::MAX, true)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{algorithm}");
        assert_eq!(
            grpc_status(res.headers()),
            Some(3),
            "{algorithm}: INVALID_ARGUMENT"
        );
        assert_eq!(
            res.headers()["grpc-message"],
            "the request's cost exceeds the rate limit's capacity: it can never be admitted"
        );
        assert!(
            res.headers().get(GRPC_RETRY_PUSHBACK_MS).is_none(),
            "{algorithm}"
        );
        assert_eq!(
            res.headers()[RATELIMIT_POLICY],
            "\"default\";q=5;w=3",
            "{algorithm}"
        );
        assert_eq!(kind(&res), Some("exceeds_capacity"), "{algorithm}");
        // Nothing was taken: the whole capacity still admits, and only then does the limit
        // answer `429`, to be retried.
        let res = svc.clone().oneshot(costing(5, false)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{algorithm}");
        let res = svc.clone().oneshot(costing(1, false)).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{algorithm}");
        assert_eq!(kind(&res), Some("rate_limited"), "{algorithm}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{algorithm}");
    }
}

/// Regression (issue 30, finding 7): `RateLimit-Policy` advertised `q=rate;w=ceil(period)`
/// while `RateLimit` counted out of the burst, so a `10 per 100 ms` bucket was advertised as
/// `q=10;w=1`, ten times under its rate. Every algorithm now advertises its rate over the
/// time its capacity takes to refill, in whole seconds, and `r` is never above `q`.
#[tokio::test]
async fn the_policy_field_advertises_the_real_rate_and_never_less_than_r() {
    async fn fields<L: Limiter>(limiter: L) -> Vec<(String, String)> {
        let svc = RateLimitLayer::builder(limiter)
            .clock(FakeClock::new())
            .admitted_headers(true)
            .build()
            .unwrap()
            .layer(counting_service(&Calls::default()));
        let mut seen = Vec::new();
        for _ in 0..2 {
            let res = svc.clone().oneshot(request()).await.unwrap();
            let text = |name| res.headers()[name].to_str().unwrap().to_owned();
            seen.push((text(&RATELIMIT_POLICY), text(&RATELIMIT)));
        }
        seen
    }
    let ms = Duration::from_millis;
    let s = Duration::from_secs;
    let both = |policy: &str, first: &str, second: &str| {
        vec![
            (policy.to_owned(), first.to_owned()),
            (policy.to_owned(), second.to_owned()),
        ]
    };
    let tb = |rate, period, burst| {
        TokenBucket::builder(rate)
            .period(period)
            .burst(burst)
            .build()
            .unwrap()
    };
    assert_eq!(
        fields(tb(10, ms(100), 10)).await,
        both(
            "\"default\";q=100;w=1",
            "\"default\";r=9;t=1",
            "\"default\";r=8;t=1"
        )
    );
    assert_eq!(
        fields(tb(300, s(1), 30)).await,
        both(
            "\"default\";q=300;w=1",
            "\"default\";r=29;t=1",
            "\"default\";r=28;t=1"
        )
    );
    assert_eq!(
        fields(tb(60, s(60), 60)).await,
        both(
            "\"default\";q=60;w=60",
            "\"default\";r=59;t=1",
            "\"default\";r=58;t=2"
        )
    );
    let fixed = FixedWindow::builder(10).window(ms(100)).build().unwrap();
    assert_eq!(
        fields(fixed).await,
        both(
            "\"default\";q=100;w=1",
            "\"default\";r=9;t=1",
            "\"default\";r=8;t=1"
        )
    );
    let sliding = SlidingWindow::builder(600).window(s(60)).build().unwrap();
    assert_eq!(
        fields(sliding).await,
        both(
            "\"default\";q=600;w=60",
            "\"default\";r=599;t=60",
            "\"default\";r=598;t=60"
        )
    );
}

#[test]
fn invalid_builds_name_the_setting() {
    let err = RateLimitLayer::builder(bucket(10, 5))
        .cost(6)
        .build()
        .unwrap_err();
    assert_eq!(
        (err.field(), err.kind()),
        ("cost", ConfigErrorKind::Conflict)
    );
    assert_eq!(
        err.to_string(),
        "cost (6) must not exceed the limiter's capacity (5, its burst or quota): no such request could ever be admitted"
    );
    for keyed in [false, true] {
        let builder = RateLimitLayer::builder(bucket(10, 5)).max_keys(0);
        let err = if keyed {
            builder.key_by_client_ip(ClientIp::default()).build()
        } else {
            builder.build()
        }
        .unwrap_err();
        assert_eq!(err.to_string(), "max_keys must be at least 1, got 0");
    }
    let err = RateLimitLayer::builder(bucket(10, 5))
        .sweep_interval(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "sweep_interval");
    for bad in ["é", "", "tab\there"] {
        let err = RateLimitLayer::builder(bucket(10, 5))
            .name(bad)
            .build()
            .unwrap_err();
        assert_eq!(
            (err.field(), err.kind()),
            ("name", ConfigErrorKind::Invalid),
            "{bad:?}"
        );
    }
    let err = RateLimitLayer::builder(bucket(10, 5))
        .name("é")
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "name must be 1 to 128 bytes of printable ASCII (0x20 to 0x7e), got \"é\""
    );
    let err = RateLimitLayer::builder(bucket(10, 5))
        .name("x".repeat(129))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "name");
    // A cost chosen per request is not checked at build time: an over-capacity request is
    // answered `413` when it comes (see `a_request_too_heavy_for_the_limit_is_answered_413_never_429`).
    assert!(
        RateLimitLayer::builder(bucket(10, 5))
            .cost_by(|_| 6)
            .build()
            .is_ok()
    );
}

#[tokio::test]
async fn new_equals_the_builder_with_defaults() {
    let by_new = RateLimitLayer::new(SlidingWindow::new(2).unwrap());
    let by_builder = RateLimitLayer::builder(SlidingWindow::new(2).unwrap())
        .build()
        .unwrap();
    for layer in [by_new, by_builder] {
        let svc = layer.layer(counting_service(&Calls::default()));
        for _ in 0..2 {
            assert_eq!(
                svc.clone().oneshot(request()).await.unwrap().status(),
                StatusCode::OK
            );
        }
        let res = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[RATELIMIT_POLICY], "\"default\";q=2;w=1");
    }
}

#[tokio::test]
async fn the_clock_and_the_key_may_be_set_in_either_order() {
    let clock = FakeClock::new();
    let clock_first = RateLimitLayer::builder(bucket(1, 1))
        .clock(clock.clone())
        .key_by_client_ip(ClientIp::new())
        .build()
        .unwrap();
    let key_first = RateLimitLayer::builder(bucket(1, 1))
        .key_by_client_ip(ClientIp::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    let (a, b) = (
        clock_first.layer(counting_service(&Calls::default())),
        key_first.layer(counting_service(&Calls::default())),
    );
    for svc in [&a, &b] {
        let status = |peer| async move { svc.clone().oneshot(from(peer)).await.unwrap().status() };
        assert_eq!(status("192.0.2.1:1").await, StatusCode::OK);
        assert_eq!(status("192.0.2.1:2").await, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(status("192.0.2.2:1").await, StatusCode::OK);
    }
    // Both read the fake clock: one second later each key has its token back.
    clock.advance(Duration::from_secs(1));
    for svc in [&a, &b] {
        assert_eq!(
            svc.clone()
                .oneshot(from("192.0.2.1:3"))
                .await
                .unwrap()
                .status(),
            StatusCode::OK
        );
    }
}

#[tokio::test]
async fn keyed_by_a_closure() {
    let layer = RateLimitLayer::builder(bucket(1, 1))
        .clock(FakeClock::new())
        .key_by(|parts: &http::request::Parts| Some(parts.uri.path().to_owned()))
        .build()
        .unwrap();
    let svc = layer.layer(counting_service(&Calls::default()));
    let to = |path: &str| Request::builder().uri(path).body(String::new()).unwrap();
    assert_eq!(
        svc.clone().oneshot(to("/a")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(to("/b")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.clone().oneshot(to("/a")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn layer_and_service_are_clone_send_sync() {
    fn assert_traits<T: Clone + Send + Sync + 'static>() {}
    assert_traits::<RateLimitLayer>();
    assert_traits::<
        RateLimit<tower::util::BoxCloneSyncService<Request<String>, Response<String>, Infallible>>,
    >();
}

#[test]
fn the_inner_service_is_reachable() {
    let calls = Calls::default();
    let mut svc = RateLimitLayer::new(bucket(1, 1)).layer(Arc::clone(&calls));
    assert!(Arc::ptr_eq(svc.get_ref(), &calls));
    assert!(Arc::ptr_eq(svc.get_mut(), &calls));
    assert!(Arc::ptr_eq(&svc.into_inner(), &calls));
}

// NOTE: paused time makes the "no request arrives" timeout deterministic.
#[tokio::test(start_paused = true)]
async fn composes_in_service_builder_and_delegates_readiness() {
    let layer = RateLimitLayer::new(bucket(1, 1));
    let (mock, mut handle) = tower_test::mock::pair::<Request<String>, Response<String>>();
    let mut svc = ServiceBuilder::new().layer(layer).service(mock);
    handle.allow(0);
    assert!(
        tokio_test_poll_ready(&mut svc).is_pending(),
        "inner not ready: neither are we"
    );
    handle.allow(2);
    assert!(tokio_test_poll_ready(&mut svc).is_ready());
    let first = svc.call(request());
    let (_req, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new("ok".to_owned()));
    assert_eq!(first.await.unwrap().status(), StatusCode::OK);
    svc.ready().await.unwrap();
    let second = svc.call(request()).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    // The rejected request never reached the inner service.
    assert!(
        tokio::time::timeout(Duration::from_millis(10), handle.next_request())
            .await
            .is_err()
    );
}

fn tokio_test_poll_ready<S: Service<Request<String>>>(svc: &mut S) -> std::task::Poll<()> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    svc.poll_ready(&mut cx).map(|r| {
        assert!(r.is_ok());
    })
}

/// Also the regression test for building the layer before the recorder is installed (as a
/// server that builds its stack, then installs a Prometheus recorder, does): metrics are
/// registered on the first request, not at build time. The keys gauge is set by the
/// layer's tick, once a second.
#[tokio::test(start_paused = true)]
async fn metrics_count_admitted_rejected_and_keys() {
    let layer = RateLimitLayer::builder(bucket(1, 1))
        .clock(FakeClock::new())
        .key_by_client_ip(ClientIp::new())
        .missing_key(MissingKey::Shared)
        .name("edge")
        .build()
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // NOTE: the test runtime is single-threaded, so the thread-local recorder sees every
    // request.
    let _guard = metrics::set_default_local_recorder(&recorder);
    let svc = layer.layer(counting_service(&Calls::default()));
    for peer in ["192.0.2.1:1", "192.0.2.1:2", "192.0.2.2:1"] {
        svc.clone().oneshot(from(peer)).await.unwrap();
    }
    svc.clone().oneshot(request()).await.unwrap();
    svc.clone().oneshot(request()).await.unwrap();
    // NOTE: past the first tick, one second after the first request.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut admitted = 0;
    let mut rejected = Vec::new();
    let mut keys = 0.0;
    let mut missing = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        assert!(
            key.labels()
                .any(|l| l.key() == "name" && l.value() == "edge"),
            "{key:?}"
        );
        match (key.name(), value) {
            // NOTE: one series per criticality (issue 33); these requests carry none, so
            // all are `critical`.
            ("ratelimit_layer_requests_admitted_total", DebugValue::Counter(n)) => {
                let level = key.labels().find(|l| l.key() == "criticality").unwrap();
                if level.value() == "critical" {
                    admitted = n;
                } else {
                    assert_eq!(n, 0, "{key:?}");
                }
            }
            ("ratelimit_layer_requests_rejected_total", DebugValue::Counter(n)) if n > 0 => {
                let class = key.labels().find(|l| l.key() == "key_class").unwrap();
                rejected.push((class.value().to_owned(), n));
            }
            ("ratelimit_layer_keys", DebugValue::Gauge(g)) => keys = g.into_inner(),
            ("ratelimit_layer_missing_key_total", DebugValue::Counter(n)) => {
                let action = key.labels().find(|l| l.key() == "action").unwrap();
                missing.push((action.value().to_owned(), n));
            }
            _ => {}
        }
    }
    assert_eq!(admitted, 3);
    rejected.sort();
    assert_eq!(
        rejected,
        vec![("keyed".to_owned(), 1), ("unkeyed".to_owned(), 1)]
    );
    assert!((keys - 2.0).abs() < f64::EPSILON);
    // Every action's series exists from the first request; only the layer's policy counts.
    missing.sort();
    assert_eq!(
        missing,
        vec![
            ("bypass".to_owned(), 0),
            ("reject".to_owned(), 0),
            ("shared".to_owned(), 2)
        ]
    );
}

/// Regression for finding 3 of the trust issue: a keyed limit whose key is missing (a server
/// that does not put the peer address in its requests) put every client in one shared
/// bucket, silently. Each policy, with the client-IP key whose key is missing here.
#[tokio::test]
async fn each_missing_key_policy_does_what_it_says() {
    let keyed = |policy: Option<MissingKey>| {
        let builder = RateLimitLayer::builder(bucket(1, 2))
            .clock(FakeClock::new())
            .key_by_client_ip(ClientIp::new())
            .admitted_headers(true);
        match policy {
            Some(policy) => builder.missing_key(policy),
            None => builder,
        }
        .build()
        .unwrap()
    };
    let run = |layer: RateLimitLayer, n: usize| async move {
        let calls = Calls::default();
        let svc = layer.layer(counting_service(&calls));
        let mut responses = Vec::new();
        for _ in 0..n {
            responses.push(svc.clone().oneshot(request()).await.unwrap());
        }
        (responses, calls.load(Ordering::SeqCst))
    };
    let codes = |responses: &[Response<String>]| -> Vec<u16> {
        responses.iter().map(|r| r.status().as_u16()).collect()
    };

    // Reject, the default for client IPs: 500, the service never called, no rate-limit
    // fields (nothing limited it).
    for layer in [keyed(None), keyed(Some(MissingKey::Reject))] {
        let (responses, calls) = run(layer, 3).await;
        assert_eq!(codes(&responses), [500, 500, 500]);
        assert_eq!(calls, 0);
        assert!(responses[0].headers().get(RATELIMIT).is_none());
    }
    // Shared: one bucket for all of them.
    let (responses, calls) = run(keyed(Some(MissingKey::Shared)), 3).await;
    assert_eq!(codes(&responses), [200, 200, 429]);
    assert_eq!(calls, 2);
    // Bypass: no limit, and no field that would describe one.
    let (responses, calls) = run(keyed(Some(MissingKey::Bypass)), 5).await;
    assert_eq!(codes(&responses), [200; 5]);
    assert_eq!(calls, 5);
    assert!(responses[4].headers().get(RATELIMIT).is_none());
    assert!(responses[4].headers().get(RATELIMIT_POLICY).is_none());

    // gRPC requests are refused in gRPC form: INTERNAL, trailers-only.
    let svc = keyed(None).layer(counting_service(&Calls::default()));
    let mut grpc = request();
    grpc.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    let r = svc.oneshot(grpc).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(grpc_status(r.headers()), Some(13));
    assert_eq!(r.body(), "");

    // A header key's default is Shared: a client may send no API key, and must not be able to
    // make the server answer 500.
    let layer = RateLimitLayer::builder(bucket(1, 1))
        .clock(FakeClock::new())
        .key_by_header(http::HeaderName::from_static("x-api-key"))
        .build()
        .unwrap();
    assert_eq!(codes(&run(layer, 2).await.0), [200, 429]);
    // A closure's default is Reject.
    let layer = RateLimitLayer::builder(bucket(1, 1))
        .clock(FakeClock::new())
        .key_by(|parts: &http::request::Parts| parts.headers.get("x-tenant").cloned())
        .build()
        .unwrap();
    assert_eq!(codes(&run(layer, 1).await.0), [500]);
}

#[test]
fn a_missing_key_policy_without_a_key_is_refused() {
    let err = RateLimitLayer::builder(bucket(1, 1))
        .missing_key(MissingKey::Bypass)
        .build()
        .unwrap_err();
    assert_eq!(
        (err.field(), err.kind()),
        ("missing_key", ConfigErrorKind::Conflict)
    );
    assert_eq!(
        err.to_string(),
        "missing_key (Bypass) applies to a keyed limit only; set key_by too, or leave \
         missing_key out"
    );
}

/// Regression (issue 30, review item D3): `max_keys` and `sweep_interval` on a limit without
/// a key were checked, then silently ignored.
#[test]
fn keyed_settings_without_a_key_are_refused() {
    for builder in [
        RateLimitLayer::builder(bucket(1, 1)).max_keys(10),
        RateLimitLayer::builder(bucket(1, 1)).sweep_interval(Duration::from_secs(5)),
    ] {
        let err = builder.build().unwrap_err();
        assert_eq!(
            (err.field(), err.kind()),
            ("max_keys", ConfigErrorKind::Conflict)
        );
    }
    assert!(
        RateLimitLayer::builder(bucket(1, 1))
            .key_by(|_: &http::request::Parts| Some(1u8))
            .max_keys(10)
            .build()
            .is_ok()
    );
}

/// Counts the events logged at one level.
struct LevelCounter(tracing::Level, AtomicUsize);

impl tracing::Subscriber for LevelCounter {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == self.0 {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Requests without a key are logged at the first, and again at most once a minute while
/// they keep coming, whatever the policy. (Regression, issue 23: they were logged once per
/// layer, then never again.) A client-IP key is missing only when the server does not put
/// the peer address in its requests: logged at `ERROR`, with the fix (issue 31, finding 8:
/// it was a `WARN`). A header key is missing when a client leaves the header out: `WARN`.
#[test]
fn a_missing_key_is_logged_at_once_then_every_minute_whatever_the_policy() {
    for (level, by_header) in [(tracing::Level::ERROR, false), (tracing::Level::WARN, true)] {
        for policy in [MissingKey::Reject, MissingKey::Shared, MissingKey::Bypass] {
            let logged = Arc::new(LevelCounter(level, AtomicUsize::new(0)));
            let count = || logged.1.load(Ordering::SeqCst);
            let dispatch = tracing::Dispatch::from(Arc::clone(&logged));
            tracing::dispatcher::with_default(&dispatch, || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .start_paused(true)
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let builder = RateLimitLayer::builder(bucket(1, 100)).clock(FakeClock::new());
                    let layer = if by_header {
                        builder
                            .key_by_header(http::HeaderName::from_static("x-api-key"))
                            .missing_key(policy)
                            .build()
                            .unwrap()
                    } else {
                        builder
                            .key_by_client_ip(ClientIp::new())
                            .missing_key(policy)
                            .build()
                            .unwrap()
                    };
                    let svc = layer.layer(counting_service(&Calls::default()));
                    // Keyed requests log nothing.
                    let mut keyed = from("192.0.2.1:1");
                    keyed
                        .headers_mut()
                        .insert("x-api-key", HeaderValue::from_static("k"));
                    svc.clone().oneshot(keyed).await.unwrap();
                    assert_eq!(count(), 0, "{level} {policy:?}");
                    for _ in 0..3 {
                        svc.clone().oneshot(request()).await.unwrap();
                    }
                    assert_eq!(count(), 1, "{level} {policy:?}");
                    for _ in 0..59 {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        svc.clone().oneshot(request()).await.unwrap();
                    }
                    assert_eq!(count(), 1, "{level} {policy:?}: not per request");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    svc.clone().oneshot(request()).await.unwrap();
                });
            });
            assert_eq!(count(), 2, "{level} {policy:?}: a minute later, again");
        }
    }
}

/// Every rejection the limit makes carries its marker (`Rejection`): of kind `RateLimited`,
/// concerning the caller for a keyed limit's own quota, the server for a shared limit (the
/// unkeyed one, a global one), with the wait it asks for and the layer's name; an admitted
/// response carries none.
#[tokio::test]
async fn rejections_carry_their_marker_and_say_whom_they_concern() {
    use overload_signal::signal::{Rejection, RejectionKind, RejectionScope};
    let marker = |r: &Response<String>| r.extensions().get::<Rejection>().cloned();
    let scope = |r: &Response<String>| marker(r).map(|m| m.scope());
    // A client over its own quota.
    let layer = RateLimitLayer::builder(bucket(1, 1))
        .clock(FakeClock::new())
        .key_by_client_ip(ClientIp::new())
        .missing_key(MissingKey::Shared)
        .name("edge")
        .build()
        .unwrap();
    let svc = layer.layer(counting_service(&Calls::default()));
    let ok = svc.clone().oneshot(from("192.0.2.1:1")).await.unwrap();
    assert_eq!(marker(&ok), None);
    let r = svc.clone().oneshot(from("192.0.2.1:1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(scope(&r), Some(RejectionScope::Caller));
    let m = marker(&r).unwrap();
    assert_eq!(m.kind(), RejectionKind::RateLimited);
    assert_eq!(m.layer().as_str(), "edge");
    assert_eq!(m.retry_after(), Some(Duration::from_secs(1)));
    // The shared limit of requests without a key concerns every client behind it.
    svc.clone().oneshot(request()).await.unwrap();
    let r = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(scope(&r), Some(RejectionScope::Server));
    // So does a global limit.
    let svc = RateLimitLayer::builder(bucket(1, 1))
        .clock(FakeClock::new())
        .build()
        .unwrap()
        .layer(counting_service(&Calls::default()));
    svc.clone().oneshot(request()).await.unwrap();
    let r = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(scope(&r), Some(RejectionScope::Server));
    // A missing key refused: marked, never judged by an overload layer.
    let svc = RateLimitLayer::builder(bucket(1, 1))
        .clock(FakeClock::new())
        .key_by_client_ip(ClientIp::new())
        .build()
        .unwrap()
        .layer(counting_service(&Calls::default()));
    let r = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        marker(&r).map(|m| m.kind()),
        Some(RejectionKind::MissingKey)
    );
}

/// Regression for issue 20: `RateLimit<S>` required `S: Clone` of every inner service,
/// because a limit kept in Redis takes the ready service into its future; a service that is
/// not `Clone`, such as a `BoxService`, could not be limited at all ("the method `oneshot`
/// exists for struct `RateLimit<BoxService<..>>`, but its trait bounds were not
/// satisfied"). A local limit, global or keyed, asks nothing of its inner service.
#[tokio::test]
async fn a_service_that_is_not_clone_is_limited() {
    type Boxed = BoxService<Request<String>, Response<String>, Infallible>;
    let calls = Calls::default();
    let boxed = || {
        let calls = Arc::clone(&calls);
        Boxed::new(service_fn(move |_: Request<String>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new("hello".to_owned())) }
        }))
    };
    async fn status(svc: &mut RateLimit<Boxed>, request: Request<String>) -> StatusCode {
        let ready = svc.ready().await.unwrap();
        ready.call(request).await.unwrap().status()
    }

    let mut global = RateLimitLayer::builder(bucket(1, 2))
        .clock(FakeClock::new())
        .build()
        .unwrap()
        .layer(boxed());
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(status(&mut global, request()).await);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );

    let mut keyed = RateLimitLayer::builder(bucket(1, 1))
        .clock(FakeClock::new())
        .key_by_client_ip(ClientIp::new())
        .build()
        .unwrap()
        .layer(boxed());
    let mut statuses = Vec::new();
    for peer in ["192.0.2.1:1", "192.0.2.1:2", "192.0.2.2:1"] {
        statuses.push(status(&mut keyed, from(peer)).await);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::OK
        ]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4, "rejections never reach it");
}

/// Every metric of a layer is registered on its first request, whatever that request
/// does, with the recorder installed then: not when the layer is built (a recorder
/// installed after building sees them all), and not when a series first changes.
#[tokio::test]
async fn every_metric_is_registered_on_the_first_request() {
    let layer = RateLimitLayer::builder(bucket(10, 10))
        .clock(FakeClock::new())
        .key_by_client_ip(ClientIp::new())
        .name("late")
        .build()
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let svc = layer.layer(counting_service(&Calls::default()));
    assert!(
        snapshotter.snapshot().into_vec().is_empty(),
        "nothing before a request"
    );
    // One admitted request, with a key: no rejection, no missing key.
    svc.oneshot(from("192.0.2.1:1")).await.unwrap();
    let mut series: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, ..)| {
            let key = key.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            format!("{}{{{}}}", key.name(), labels.join(","))
        })
        .collect();
    series.sort();
    // The request counters, one series per criticality (issue 33).
    let levels = ["critical-plus", "critical", "sheddable-plus", "sheddable"];
    let mut expected: Vec<String> = [
        "ratelimit_layer_keys{name=late}",
        "ratelimit_layer_missing_key_total{name=late,action=bypass}",
        "ratelimit_layer_missing_key_total{name=late,action=reject}",
        "ratelimit_layer_missing_key_total{name=late,action=shared}",
    ]
    .map(String::from)
    .to_vec();
    for level in levels {
        expected.push(format!(
            "ratelimit_layer_requests_admitted_total{{name=late,criticality={level}}}"
        ));
    }
    for class in ["global", "keyed", "overflow", "unkeyed"] {
        for level in levels {
            expected.push(format!(
                "ratelimit_layer_requests_rejected_total{{name=late,key_class={class},criticality={level}}}"
            ));
        }
    }
    expected.sort();
    assert_eq!(series, expected);
}

/// Two rate limits in one process, named apart: two series an SRE tells apart by `name`,
/// each counting its own layer's requests; and each name is its `RateLimit-Policy` name on
/// the wire.
#[tokio::test(start_paused = true)]
async fn two_limits_named_apart_are_two_series() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let layer = |name: &str, burst| {
        RateLimitLayer::builder(bucket(1, burst))
            .clock(FakeClock::new())
            .name(name)
            .build()
            .unwrap()
            .layer(counting_service(&Calls::default()))
    };
    let (payments, search) = (layer("payments", 1), layer("search", 3));
    for _ in 0..4 {
        let payments = payments.clone().oneshot(request()).await.unwrap();
        if payments.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(
                payments.headers()[RATELIMIT_POLICY]
                    .to_str()
                    .unwrap()
                    .starts_with("\"payments\";")
            );
        }
        let search = search.clone().oneshot(request()).await.unwrap();
        if search.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(
                search.headers()[RATELIMIT_POLICY]
                    .to_str()
                    .unwrap()
                    .starts_with("\"search\";")
            );
        }
    }
    // NOTE: admissions are counted per core and added to the counter by the layer's tick,
    // once a second.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut counted = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let name = key
            .labels()
            .find(|l| l.key() == "name")
            .unwrap()
            .value()
            .to_owned();
        let class = key
            .labels()
            .find(|l| l.key() == "key_class")
            .map(|l| l.value().to_owned());
        if let DebugValue::Counter(n) = value {
            if n > 0 {
                counted.push((key.name().to_owned(), name, class, n));
            }
        }
    }
    counted.sort();
    let admitted = "ratelimit_layer_requests_admitted_total".to_owned();
    let rejected = "ratelimit_layer_requests_rejected_total".to_owned();
    let global = Some("global".to_owned());
    assert_eq!(
        counted,
        [
            (admitted.clone(), "payments".to_owned(), None, 1),
            (admitted, "search".to_owned(), None, 3),
            (rejected.clone(), "payments".to_owned(), global.clone(), 3),
            (rejected, "search".to_owned(), global, 1),
        ]
    );
}

/// A limit that starts rejecting is logged once at `WARN` however many requests it
/// rejects, with the layer's name, and once at `INFO` when it has rejected nothing for the
/// quiet period, from the layer's tick, with no request to prompt it; a new wave is a new
/// episode.
#[tokio::test(start_paused = true)]
async fn an_engaged_limit_is_logged_once_and_released_after_the_quiet_period() {
    let (logs, _guard) = support::Logs::capture();
    let svc = RateLimitLayer::builder(bucket(1, 1))
        .name("api")
        .build()
        .unwrap()
        .layer(counting_service(&Calls::default()));
    assert_eq!(svc.clone().oneshot(request()).await.unwrap().status(), 200);
    for _ in 0..100 {
        let r = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    let engaged = logs.at(tracing::Level::WARN, "rate limit engaged");
    assert_eq!(engaged.len(), 1, "one WARN for 100 rejections");
    assert_eq!(engaged[0].name.as_deref(), Some("api"));
    assert!(logs.at(tracing::Level::INFO, "released").is_empty());

    // No traffic: still engaged just before the quiet period ends, released just after.
    let quiet = RateLimitLayer::QUIET_PERIOD;
    tokio::time::sleep(quiet - Duration::from_millis(500)).await;
    assert!(logs.at(tracing::Level::INFO, "released").is_empty());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let released = logs.at(tracing::Level::INFO, "rate limit released");
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].name.as_deref(), Some("api"));

    // A new wave: a new episode.
    for _ in 0..3 {
        svc.clone().oneshot(request()).await.unwrap();
    }
    assert_eq!(logs.at(tracing::Level::WARN, "rate limit engaged").len(), 2);
    tokio::time::sleep(quiet * 2).await;
    assert_eq!(
        logs.at(tracing::Level::INFO, "rate limit released").len(),
        2
    );
}

/// Regression (issue 23, finding 4): a gRPC-Web request (`content-type:
/// application/grpc-web...`, browsers and Envoy's gRPC-Web filter) got `429`, an HTTP status
/// a gRPC-Web client reads as a transport failure. It gets `RESOURCE_EXHAUSTED` in a
/// trailers-only answer, in gRPC-Web's content type, with the pushback.
#[tokio::test]
async fn grpc_web_rejections_are_grpc_statuses() {
    let svc = RateLimitLayer::builder(bucket(1, 1))
        .clock(FakeClock::new())
        .build()
        .unwrap()
        .layer(counting_service(&Calls::default()));
    svc.clone().oneshot(request()).await.unwrap();
    for (sent, answered) in [
        ("application/grpc-web+proto", "application/grpc-web+proto"),
        (
            "application/grpc-web-text",
            "application/grpc-web-text+proto",
        ),
    ] {
        let mut req = request();
        req.headers_mut()
            .insert(http::header::CONTENT_TYPE, HeaderValue::from_static(sent));
        let r = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{sent}");
        assert_eq!(r.headers()[http::header::CONTENT_TYPE], answered);
        assert_eq!(grpc_status(r.headers()), Some(8));
        assert!(r.headers().contains_key(GRPC_RETRY_PUSHBACK_MS));
        assert!(r.headers().contains_key(RATELIMIT));
    }
}
