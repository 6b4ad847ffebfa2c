//! A limit kept in Redis, through the layer, against a real `redis-server` on 127.0.0.1:
//! shared by separate layers (as by separate processes), per key, and what happens when
//! Redis is stopped, frozen, or never there.
//!
//! Each test starts its own `redis-server` (`RedisServer`), and fails, never skips, when it
//! cannot.

mod redis_support;

use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_util::debugging::DebuggingRecorder;
use overload_signal::protocol::{RATELIMIT, RATELIMIT_POLICY};
use ratelimit_layer::redis::RedisStore;
use ratelimit_layer::redis::testing::RedisServer;
use ratelimit_layer::{ConfigErrorKind, RateLimitLayer, TokenBucket};
use redis_support::{GENEROUS, Reading, Svc, header, hourly, ok, read, send, store};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Two layers built apart, each with its own store (as two processes): one limit.
#[tokio::test]
async fn separate_layers_share_one_limit() {
    let server = RedisServer::start();
    let a = RateLimitLayer::builder(hourly(10))
        .admitted_headers(true)
        .redis(store(&server).await)
        .budget(GENEROUS)
        .build()
        .unwrap()
        .layer(ok());
    let b = RateLimitLayer::builder(hourly(10))
        .admitted_headers(true)
        .redis(store(&server).await)
        .budget(GENEROUS)
        .build()
        .unwrap()
        .layer(ok());
    let (a, b) = (Svc::new(a), Svc::new(b));
    for n in 1..=10 {
        let response = send(if n % 2 == 0 { &a } else { &b }).await;
        assert_eq!(response.status(), StatusCode::OK, "request {n}");
        // What is left is the fleet's, whichever process answers.
        assert_eq!(
            header(&response, &RATELIMIT),
            format!("\"default\";r={};t={}", 10 - n, n * 3_600)
        );
    }
    for svc in [&a, &b] {
        let response = send(svc).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        // One an hour, bursts of 10: 10 over the 10 hours the burst takes to refill (issue
        // 30, finding 7: it was `q=1;w=3600`, under the `r` of 10 a fresh bucket shows).
        assert_eq!(
            header(&response, &RATELIMIT_POLICY),
            "\"default\";q=10;w=36000"
        );
        let retry_after: u64 = header(&response, &http::header::RETRY_AFTER)
            .parse()
            .unwrap();
        assert!((3_590..=3_600).contains(&retry_after), "{retry_after}");
    }
    assert_eq!(server.command("EXISTS ratelimit:default:tb:g"), ":1");
}

#[tokio::test]
async fn keys_are_limited_apart_across_processes() {
    let server = RedisServer::start();
    let layer = |store: RedisStore| {
        Svc::new(
            RateLimitLayer::builder(hourly(2))
                .key_by_header(http::HeaderName::from_static("x-api-key"))
                .name("api")
                .redis(store)
                .key_prefix("edge")
                .budget(GENEROUS)
                .build()
                .unwrap()
                .layer(ok()),
        )
    };
    let (a, b) = (layer(store(&server).await), layer(store(&server).await));
    let with_key = |key: &'static str| {
        Request::builder()
            .header("x-api-key", key)
            .body(())
            .unwrap()
    };
    let status = |svc: &Svc, key| {
        let svc = svc.clone();
        async move { svc.oneshot(with_key(key)).await.unwrap().status() }
    };
    assert_eq!(status(&a, "alice").await, StatusCode::OK);
    assert_eq!(status(&b, "alice").await, StatusCode::OK);
    assert_eq!(status(&a, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(&b, "bob").await, StatusCode::OK);
    // Requests without the header share one limit of their own.
    assert_eq!(send(&a).await.status(), StatusCode::OK);
    // Two keys, named by a keyed hash under the secret the two layers share through Redis
    // (issue 31, finding 4), never by the client's bytes.
    assert_eq!(
        server.command("EVAL \"return #redis.call('KEYS', 'edge:api:tb:k:*')\" 0"),
        ":2"
    );
    assert_eq!(server.command("EXISTS edge:api:tb:k:alice"), ":0");
    assert_eq!(server.command("EXISTS edge:secret"), ":1");
    assert_eq!(server.command("EXISTS edge:api:tb:u"), ":1");
}

/// Counts the `WARN` events this crate logs about Redis, and its `INFO` events about Redis
/// (not the rate limit's own episodes, logged when the local share rejects).
#[derive(Clone, Default)]
struct Warnings(Arc<AtomicUsize>, Arc<AtomicUsize>);

impl Warnings {
    fn infos(&self) -> usize {
        self.1.load(Ordering::SeqCst)
    }

    /// The counter as this thread's subscriber. tracing caches each callsite's interest
    /// process-wide, computed on the thread that reaches it first; with one dispatcher alive
    /// a sibling test's thread (no subscriber) would cache "never" and this test would see
    /// nothing. A global subscriber interested in every callsite (and enabling none) keeps
    /// two dispatchers alive, so the interest is the union of both.
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        static ANCHOR: std::sync::Once = std::sync::Once::new();
        ANCHOR.call_once(|| {
            let anchor = tracing_subscriber::registry().with(Anchor);
            // NOTE: another global subscriber already installed serves as well.
            let _ = tracing::subscriber::set_global_default(anchor);
        });
        let guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()));
        tracing::callsite::rebuild_interest_cache();
        guard
    }
}

/// Interested in every callsite, enabling none: see [`Warnings::install`].
struct Anchor;

impl<S: Subscriber> tracing_subscriber::Layer<S> for Anchor {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }

    fn enabled(&self, _: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
        false
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        if !event.metadata().target().starts_with("ratelimit_layer") {
            return;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if !message.0.contains("Redis") {
            return;
        }
        match *event.metadata().level() {
            Level::WARN => self.0.fetch_add(1, Ordering::SeqCst),
            Level::INFO => self.1.fetch_add(1, Ordering::SeqCst),
            _ => 0,
        };
    }
}

/// Redis stopped: every request is answered, by the local share (half of the burst of 10),
/// never with a server error; the failure is logged once and counted. Redis back: the limit
/// is decided in Redis again within the 2 s.
#[tokio::test(flavor = "current_thread")]
async fn falls_back_to_the_local_share_and_returns_when_redis_answers() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let warnings = Warnings::default();
    let _logs = warnings.install();

    let mut server = RedisServer::start();
    let svc = Svc::new(
        RateLimitLayer::builder(hourly(10))
            .admitted_headers(true)
            .redis(store(&server).await)
            .local_share(0.5)
            .recheck_interval(Duration::from_millis(50))
            .budget(Duration::from_millis(500))
            .build()
            .unwrap()
            .layer(ok()),
    );
    for n in 1..=3 {
        let response = send(&svc).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(header(&response, &RATELIMIT).contains(&format!("r={}", 10 - n)));
    }
    assert_eq!(read(&snapshotter).up, Some(1.0));

    server.stop();
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(send(&svc).await.status());
    }
    // The local share: a burst of 5 (half of 10), fresh, then 429; no 5xx.
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(admitted, 5, "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::OK || *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    assert_eq!(warnings.0.load(Ordering::SeqCst), 1, "logged once");
    let reading = read(&snapshotter);
    assert_eq!(reading.up, Some(0.0));
    assert_eq!(reading.fallbacks.iter().sum::<u64>(), 8, "{reading:?}");

    server.restart();
    let restarted = Instant::now();
    // The restarted Redis is empty (no persistence): its fresh bucket of 10 admits where the
    // spent local share rejects, so a 200 says the limit is in Redis again.
    let response = loop {
        let response = send(&svc).await;
        if response.status() == StatusCode::OK {
            break response;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(2),
            "still falling back 2 s after Redis came back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        header(&response, &RATELIMIT).contains("r=9"),
        "{response:?}"
    );
    assert_eq!(read(&snapshotter).up, Some(1.0));
    assert_eq!(
        warnings.0.load(Ordering::SeqCst),
        1,
        "no new warning on the way back"
    );
    assert_eq!(warnings.infos(), 1, "the way back is logged once, at INFO");
    assert_eq!(server.command("EXISTS ratelimit:default:tb:g"), ":1");
}

/// With no traffic at all, Redis lost is seen (one `WARN`, `redis_up` 0) and Redis back is
/// seen (one `INFO`, `redis_up` 1): while no request asks Redis, the layer checks it every
/// recheck interval, so the gauge and the logs do not wait for a request to be true.
#[tokio::test(flavor = "current_thread")]
async fn redis_lost_and_back_without_traffic_is_seen() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let warnings = Warnings::default();
    let _logs = warnings.install();
    let mut server = RedisServer::start();
    let svc = Svc::new(
        RateLimitLayer::builder(hourly(10))
            .name("idle")
            .redis(store(&server).await)
            .recheck_interval(Duration::from_millis(50))
            .budget(Duration::from_millis(500))
            .build()
            .unwrap()
            .layer(ok()),
    );
    // The first request registers the metrics and starts the checks.
    assert_eq!(send(&svc).await.status(), StatusCode::OK);
    assert_eq!(read(&snapshotter).up, Some(1.0));

    server.stop();
    let stopped = Instant::now();
    while warnings.0.load(Ordering::SeqCst) == 0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "Redis stopped and no warning"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Checks count no fallback: no request was decided locally.
    assert_eq!(
        read(&snapshotter),
        Reading {
            fallbacks: [0, 0, 0],
            up: Some(0.0),
            rejected: [0; 4],
        }
    );

    server.restart();
    let restarted = Instant::now();
    while warnings.infos() == 0 {
        assert!(
            restarted.elapsed() < Duration::from_secs(5),
            "Redis back and no INFO"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(read(&snapshotter).up, Some(1.0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(warnings.0.load(Ordering::SeqCst), 1, "one WARN");
    assert_eq!(warnings.infos(), 1, "one INFO");
    // The next request is decided in Redis, whose fresh bucket has 9 left after it.
    assert_eq!(send(&svc).await.status(), StatusCode::OK);
    assert_eq!(server.command("EXISTS ratelimit:idle:tb:g"), ":1");
}

fn signal(server: &RedisServer, name: &str) {
    let pid = server.pid().expect("the server runs").to_string();
    let status = Command::new("kill").args([name, &pid]).status().unwrap();
    assert!(status.success(), "kill {name} {pid}");
}

/// A frozen Redis (SIGSTOP: connected, silent) costs the first requests their budget, as
/// many as it takes to turn Redis away (`AWAY_AFTER_FAILURES`, three in a row); the next
/// ones are decided locally at once until a recheck finds Redis again.
#[tokio::test(flavor = "current_thread")]
async fn a_frozen_redis_costs_three_budgets_then_nothing() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let server = RedisServer::start();
    let budget = Duration::from_millis(100);
    let svc = Svc::new(
        RateLimitLayer::builder(hourly(10))
            .redis(store(&server).await)
            .budget(budget)
            // NOTE: longer than the test, so that no recheck waits out a budget in it.
            .recheck_interval(Duration::from_secs(60))
            .build()
            .unwrap()
            .layer(ok()),
    );
    assert_eq!(send(&svc).await.status(), StatusCode::OK);
    assert_eq!(
        ratelimit_layer::redis::RedisLayerBuilder::AWAY_AFTER_FAILURES,
        3
    );

    signal(&server, "-STOP");
    let mut first = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        assert_eq!(send(&svc).await.status(), StatusCode::OK);
        first.push(started.elapsed());
    }
    let started = Instant::now();
    for _ in 0..5 {
        assert_eq!(send(&svc).await.status(), StatusCode::OK);
    }
    let next_five = started.elapsed();
    signal(&server, "-CONT");

    // The first three each waited out the budget (and not much more: the margin is for a
    // loaded machine); the next five waited for nothing.
    for first in first {
        assert!(first >= budget && first < budget * 5, "{first:?}");
    }
    assert!(next_five < budget, "{next_five:?}");
    assert_eq!(read(&snapshotter).fallbacks, [3, 0, 5]);
}

/// A server whose Redis is not there at all starts and serves with its local share.
#[tokio::test]
async fn redis_never_there_is_a_local_limit() {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = RedisStore::new(&format!("redis://127.0.0.1:{port}")).unwrap();
    let mut svc = RateLimitLayer::builder(hourly(4))
        .redis(store)
        .local_share(0.5)
        .build()
        .unwrap()
        .layer(ok());
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let ready = svc.ready().await.unwrap();
        statuses.push(ready.call(Request::new(())).await.unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

/// Regression (issue 30, finding 7), for a limit kept in Redis: a request above the
/// limit's capacity, which the decider leaves to the local limiter without asking Redis, is
/// answered `413` with the fleet's policy, as a local limit answers it, whether Redis is
/// there or not; a request above the local share's capacity but within the fleet's waits
/// for Redis (`429`), since it is admissible once Redis is back.
#[tokio::test(flavor = "current_thread")]
async fn a_request_too_heavy_for_the_fleets_limit_is_413_with_redis_or_without() {
    let costing = |cost: u32| {
        let mut req = Request::new(());
        req.headers_mut().insert("x-cost", cost.into());
        req
    };
    let layer = |store| {
        Svc::new(
            RateLimitLayer::builder(hourly(10))
                .cost_by(|parts| parts.headers["x-cost"].to_str().unwrap().parse().unwrap())
                .redis(store)
                .local_share(0.5)
                .budget(GENEROUS)
                .build()
                .unwrap()
                .layer(ok()),
        )
    };
    let call = |svc: &Svc, cost| {
        let svc = svc.clone();
        async move { svc.oneshot(costing(cost)).await.unwrap() }
    };
    let fleet = "\"default\";q=10;w=36000";
    let mut server = RedisServer::start();
    let svc = layer(store(&server).await);
    let res = call(&svc, 11).await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(&res, &RATELIMIT_POLICY), fleet);
    assert!(res.headers().get(http::header::RETRY_AFTER).is_none());
    assert!(res.headers().get(RATELIMIT).is_none());
    // Within the fleet's capacity, above the local share's: Redis decides.
    assert_eq!(call(&svc, 7).await.status(), StatusCode::OK);

    server.stop();
    let res = call(&svc, 11).await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(&res, &RATELIMIT_POLICY), fleet);
    // The local share (a burst of 5) cannot take 7 now; the fleet can once Redis is back.
    let res = call(&svc, 7).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get(http::header::RETRY_AFTER).is_some());
}

type Builder = ratelimit_layer::redis::RedisLayerBuilder<
    TokenBucket,
    ratelimit_layer::clock::TokioClock,
    ratelimit_layer::key::NoKey,
>;

#[test]
fn redis_settings_are_checked_by_name() {
    let store = RedisStore::new("redis://127.0.0.1:6379").unwrap();
    let err = |f: fn(Builder) -> Builder| {
        f(RateLimitLayer::builder(hourly(10)).redis(store.clone()))
            .build()
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(|b| b.local_share(1.5)),
        "local_share must be within (0, 1], got 1.5"
    );
    assert_eq!(
        err(|b| b.local_share(0.0)),
        "local_share must be within (0, 1], got 0.0"
    );
    assert_eq!(
        err(|b| b.local_share(f64::NAN)),
        "local_share must be a finite number, got NaN"
    );
    assert_eq!(
        err(|b| b.budget(Duration::ZERO)),
        "budget must be greater than zero, got 0ns"
    );
    assert_eq!(
        err(|b| b.recheck_interval(Duration::ZERO)),
        "recheck_interval must be greater than zero, got 0ns"
    );
    assert_eq!(
        err(|b| b.key_prefix("")),
        "key_prefix must be non-empty, got \"\""
    );
    let err = RateLimitLayer::builder(hourly(10))
        .cost(4)
        .redis(store.clone())
        .local_share(0.25)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "local_share");
    assert!(
        err.to_string()
            .contains("below the cost of every request (4)"),
        "{err}"
    );
    // Regression (issue 30, review item D3): a name set on this builder replaced the one
    // set before `redis`, and a reservation lease without a reservation did nothing.
    let err = RateLimitLayer::builder(hourly(10))
        .name("api")
        .redis(store.clone())
        .name("edge")
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "name set before redis (\"api\") and after it (\"edge\"): set it once"
    );
    assert!(
        RateLimitLayer::builder(hourly(10))
            .redis(store.clone())
            .name("edge")
            .build()
            .is_ok()
    );
    // Even when the first name is the default's.
    assert_eq!(
        err_field(
            RateLimitLayer::builder(hourly(10))
                .name("default")
                .redis(store.clone())
                .name("edge")
        ),
        "name"
    );
    assert_eq!(
        err_field(
            RateLimitLayer::builder(hourly(10))
                .redis(store.clone())
                .reservation_lease(Duration::from_millis(50))
        ),
        "reservation_lease"
    );
    assert!(
        RateLimitLayer::builder(hourly(10))
            .redis(store)
            .reservation(5)
            .reservation_lease(Duration::from_millis(50))
            .build()
            .is_ok()
    );
}

/// Issue 31, finding 4: a brace in the key prefix or the layer's name made a hash tag of
/// every key's namespace (`{edge}:api:tb:k:...`): every key of the limit in one Cluster
/// slot, whatever the keys. Both are checked now, with the other bytes that would break the
/// key layout (a `:` in the name, which would let two layers' namespaces meet; spaces and
/// control bytes).
#[test]
fn key_layout_breaking_prefixes_and_names_are_refused() {
    let store = RedisStore::new("redis://127.0.0.1:6379").unwrap();
    let prefix = |prefix: &str| {
        RateLimitLayer::builder(hourly(10))
            .redis(store.clone())
            .key_prefix(prefix)
            .build()
            .map(drop)
            .map_err(|e| (e.field(), e.kind(), e.to_string()))
    };
    for bad in ["{edge}", "edge{", "ed}ge", "my app", "edge\n"] {
        let (field, kind, message) = prefix(bad).unwrap_err();
        assert_eq!(
            (field, kind),
            ("key_prefix", ConfigErrorKind::Invalid),
            "{bad:?}"
        );
        assert!(message.contains("no `{`, `}`"), "{message}");
    }
    assert!(prefix("app:edge").is_ok(), "a `:` in the prefix is fine");
    let name = |name: &str| {
        RateLimitLayer::builder(hourly(10))
            .name(name)
            .redis(store.clone())
            .build()
            .map(drop)
            .map_err(|e| (e.field(), e.kind()))
    };
    for bad in ["{api}", "a}", "api:v2", "my api"] {
        assert_eq!(
            name(bad).unwrap_err(),
            ("name", ConfigErrorKind::Invalid),
            "{bad:?}"
        );
    }
    assert!(name("api-v2").is_ok());
    // A secret too short to be one.
    let err = RateLimitLayer::builder(hourly(10))
        .redis(store)
        .key_secret(b"short")
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "key_secret");
    assert!(!err.to_string().contains("short"), "never printed: {err}");
}

/// Issue 31, finding 4: a key's name in Redis is a keyed hash of it under the fleet's
/// secret. Layers of two processes given the same secret name a key alike (one limit);
/// a layer given another secret names it otherwise (another limit). Without a secret,
/// layers share the one kept in Redis (made by the first with `SET NX`): the same keys
/// again, and the same as a layer given that secret.
#[tokio::test]
async fn layers_with_one_secret_name_keys_alike_and_other_secrets_do_not() {
    let server = RedisServer::start();
    let layer = |store: RedisStore, secret: Option<&[u8]>| {
        let builder = RateLimitLayer::builder(hourly(2))
            .key_by_header(http::HeaderName::from_static("x-api-key"))
            .name("api")
            .redis(store)
            .budget(GENEROUS);
        let builder = match secret {
            Some(secret) => builder.key_secret(secret),
            None => builder,
        };
        Svc::new(builder.build().unwrap().layer(ok()))
    };
    let status = |svc: &Svc, key: &'static str| {
        let svc = svc.clone();
        async move {
            let request = Request::builder()
                .header("x-api-key", key)
                .body(())
                .unwrap();
            svc.oneshot(request).await.unwrap().status().as_u16()
        }
    };
    let one = b"0123456789abcdef-the-fleet-secret";
    let other = b"0123456789abcdef-another-secret!!";
    let (a, b) = (
        layer(store(&server).await, Some(one)),
        layer(store(&server).await, Some(one)),
    );
    let c = layer(store(&server).await, Some(other));
    let mut statuses = Vec::new();
    for svc in [&a, &b, &a, &c, &c] {
        statuses.push(status(svc, "alice").await);
    }
    assert_eq!(
        statuses,
        [200, 200, 429, 200, 200],
        "a and b share alice's limit; c keeps its own"
    );
    assert_eq!(
        server.command("EXISTS ratelimit:api:tb:k:alice"),
        ":0",
        "no plain name"
    );
    let names = || -> u64 {
        server
            .command("EVAL \"return #redis.call('KEYS', 'ratelimit:api:tb:k:*')\" 0")
            .trim_start_matches(':')
            .parse()
            .unwrap()
    };
    assert_eq!(names(), 2, "one name per secret");

    // Without a secret: the one kept in Redis, shared.
    let (d, e) = (
        layer(store(&server).await, None),
        layer(store(&server).await, None),
    );
    let mut statuses = Vec::new();
    for svc in [&d, &e, &d] {
        statuses.push(status(svc, "bob").await);
    }
    assert_eq!(statuses, [200, 200, 429], "d and e share bob's limit");
    assert_eq!(names(), 3);
    // A layer given the secret kept in Redis names bob alike.
    let kept: Vec<u8> = {
        let client = redis::Client::open(server.url()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("GET")
            .arg("ratelimit:secret")
            .query_async(&mut connection)
            .await
            .unwrap()
    };
    assert!(kept.len() >= 16, "the secret is kept under the prefix");
    let f = layer(store(&server).await, Some(&kept));
    assert_eq!(status(&f, "bob").await, 429, "the same limit as d and e");
}

fn err_field(builder: Builder) -> &'static str {
    builder.build().unwrap_err().field()
}

/// A request without a key follows the layer's missing-key policy with Redis too: `Reject`
/// answers 500 and `Bypass` admits without asking Redis, `Shared` keeps one bucket in Redis
/// for every such request, shared by separate layers (as by separate processes).
#[tokio::test]
async fn requests_without_a_key_follow_the_missing_key_policy() {
    use ratelimit_layer::key::{ClientIp, MissingKey};
    let server = RedisServer::start();
    let server = &server;
    let keyed = |policy| async move {
        Svc::new(
            RateLimitLayer::builder(hourly(2))
                .key_by_client_ip(ClientIp::new())
                .missing_key(policy)
                .redis(store(server).await)
                .budget(GENEROUS)
                .build()
                .unwrap()
                .layer(ok()),
        )
    };
    let codes = |responses: Vec<Response<String>>| -> Vec<u16> {
        responses.iter().map(|r| r.status().as_u16()).collect()
    };
    let reject = keyed(MissingKey::Reject).await;
    let bypass = keyed(MissingKey::Bypass).await;
    let (a, b) = (
        keyed(MissingKey::Shared).await,
        keyed(MissingKey::Shared).await,
    );
    let mut responses = Vec::new();
    for _ in 0..2 {
        responses.push(send(&reject).await);
    }
    assert_eq!(codes(responses), [500, 500]);
    let mut responses = Vec::new();
    for _ in 0..4 {
        responses.push(send(&bypass).await);
    }
    assert_eq!(codes(responses), [200; 4]);
    // One bucket of 2 in Redis for both layers.
    let responses = vec![
        send(&a).await,
        send(&b).await,
        send(&a).await,
        send(&b).await,
    ];
    assert_eq!(codes(responses), [200, 200, 429, 429]);
}

/// While Redis is away, a request that the missing-key policy decides without a limit
/// (`Bypass` here) never needed Redis: it is not counted as a fallback. A keyed request in
/// the same layer is.
#[tokio::test(flavor = "current_thread")]
async fn requests_without_a_key_are_no_fallback_while_redis_is_away() {
    use ratelimit_layer::key::{ClientIp, MissingKey};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let mut server = RedisServer::start();
    let svc = Svc::new(
        RateLimitLayer::builder(hourly(10))
            .key_by_client_ip(ClientIp::new())
            .missing_key(MissingKey::Bypass)
            .redis(store(&server).await)
            .budget(GENEROUS)
            .build()
            .unwrap()
            .layer(ok()),
    );
    server.stop();
    // A keyed request finds Redis away: one fallback, and the layer now knows.
    let mut keyed = Request::new(());
    keyed
        .extensions_mut()
        .insert(std::net::SocketAddr::from(([127, 0, 0, 7], 40_000)));
    let response = svc.clone().oneshot(keyed).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let fallbacks = read(&snapshotter).fallbacks;
    assert_eq!(fallbacks.iter().sum::<u64>(), 1, "{fallbacks:?}");
    // Requests without a key are admitted by the policy, without asking anyone.
    for _ in 0..3 {
        assert_eq!(send(&svc).await.status(), StatusCode::OK);
    }
    assert_eq!(read(&snapshotter).fallbacks, [0, 0, 0]);
}

/// The calls of `EVALSHA` (and `EVAL`) a server has run, from `INFO commandstats`.
fn script_calls(server: &RedisServer) -> u64 {
    server
        .info("commandstats")
        .lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| line.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next())
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

/// The local reservation: two layers (as two processes) take units in batches of up to
/// 10 from one limit of 50 that does not refill; they admit exactly 50 between them (every
/// unit spent was taken from Redis first, and all were spent), with far fewer round
/// trips than requests; once Redis has rejected, the rejections are answered without
/// asking it again.
#[tokio::test]
async fn a_reservation_admits_the_limit_with_fewer_round_trips() {
    let server = RedisServer::start();
    let layer = |store| {
        Svc::new(
            RateLimitLayer::builder(hourly(50))
                .redis(store)
                .budget(GENEROUS)
                .reservation(10)
                .reservation_lease(Duration::from_secs(60))
                .build()
                .unwrap()
                .layer(ok()),
        )
    };
    let (a, b) = (layer(store(&server).await), layer(store(&server).await));
    let before = script_calls(&server);
    let mut admitted = 0;
    for i in 0..120 {
        let svc = if i % 2 == 0 { &a } else { &b };
        if send(svc).await.status() == StatusCode::OK {
            admitted += 1;
        }
    }
    let calls = script_calls(&server) - before;
    println!("admitted {admitted} of 120 with {calls} script calls");
    assert_eq!(admitted, 50, "the limit, exactly");
    assert!(calls <= 20, "{calls} round trips for 120 requests");
    // Rejected by Redis an hour ago (of its clock): answered here.
    let calls = script_calls(&server);
    for svc in [&a, &b] {
        assert_eq!(send(svc).await.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(
        script_calls(&server),
        calls,
        "no round trip for a known rejection"
    );
}
