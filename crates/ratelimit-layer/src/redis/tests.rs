//! The scripts against a real `redis-server`, on times the tests choose: they must decide as
//! the local limiters do.

use std::time::Duration;

use super::command::{RedisKeyName, command, evalsha};
use super::connection::RedisConnection;
use super::script::{ScriptArgs, ScriptReply, ScriptedLimit, Sealed};
use super::store::RedisStore;
use super::testing::RedisServer;
use crate::algorithm::{Decision, Limiter, QuotaStatus, SlidingWindow, TokenBucket};

/// A limit's script and its keys' namespace, as a layer named `default` with the key
/// prefix `test` has them.
struct TestLimit {
    scripted: ScriptedLimit,
    namespace: Vec<u8>,
}

fn settings<L: Limiter + Sealed>(limiter: &L) -> TestLimit {
    let scripted = limiter.scripted().unwrap();
    TestLimit {
        namespace: format!("test:default:{}:", scripted.tag).into_bytes(),
        scripted,
    }
}

/// The arguments of a call of `cost` at `now_micros`.
fn at(cost: u32, now_micros: u64) -> ScriptArgs {
    ScriptArgs {
        now_micros: Some(now_micros),
        ..ScriptArgs::cost(cost)
    }
}

/// The name of `key` under the tests' secret.
fn name_of(key: &str) -> String {
    let namer = crate::redis::secret::KeyNamer::new(b"0123456789abcdef");
    String::from_utf8(namer.name(key).to_vec()).unwrap()
}

/// The limit of `key`, named under the tests' secret.
fn keyed(key: &str) -> RedisKeyName {
    RedisKeyName::Keyed(crate::redis::secret::KeyNamer::new(b"0123456789abcdef").name(key))
}

/// One call in Redis for `key`, and its reply.
async fn call(
    settings: &TestLimit,
    connection: &mut RedisConnection,
    key: &str,
    args: ScriptArgs,
) -> ScriptReply {
    let cmd = command(&settings.scripted, &settings.namespace, &keyed(key), args);
    let reply = evalsha(connection, &cmd, settings.scripted.code)
        .await
        .unwrap();
    settings.scripted.read_reply(&reply, args.cost).unwrap()
}

/// One decision in Redis for `key` at `now_micros`.
async fn remote(
    settings: &TestLimit,
    connection: &mut RedisConnection,
    key: &str,
    cost: u32,
    now_micros: u64,
) -> (Decision, QuotaStatus) {
    match call(settings, connection, key, at(cost, now_micros)).await {
        ScriptReply::Decided {
            decision, status, ..
        } => (decision, status),
        ScriptReply::NoSuchKey => panic!("the key may be made"),
    }
}

/// A small deterministic generator (xorshift), so a failing sequence can be replayed.
struct Steps(u64);

impl Steps {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// Runs the same random sequence of (time step, cost) through `limiter` locally and in
/// Redis, and requires the same decision and quota status at every step.
async fn agree<L: Limiter + Sealed>(limiter: L, seed: u64, max_step_micros: u64, max_cost: u64) {
    let server = RedisServer::start();
    let store = RedisStore::new(&server.url()).unwrap();
    let settings = settings(&limiter);
    let (mut connection, _) = store.connection().unwrap();
    let state = L::State::default();
    let mut steps = Steps(seed);
    // An arbitrary origin in the server's range of times (microseconds since 1970).
    let mut now = 1_700_000_000_000_000_u64;
    let origin = now;
    let mut admitted = 0;
    for i in 0..400 {
        now += steps.next(max_step_micros);
        let cost = u32::try_from(1 + steps.next(max_cost)).unwrap();
        let local_now = (now - origin) * 1_000;
        let local = limiter.check(&state, local_now, cost);
        let local_status = limiter.status(&state, local_now);
        let (decision, status) = remote(&settings, &mut connection, "k", cost, now).await;
        assert_eq!(decision, local, "step {i}, seed {seed}, cost {cost}");
        assert_eq!(status, local_status, "step {i}, seed {seed}");
        admitted += u32::from(decision.is_allowed());
    }
    // The sequence exercised both answers.
    assert!(
        admitted > 20 && admitted < 380,
        "admitted {admitted} of 400"
    );
}

/// The origin is a multiple of every window, so the local and the remote windows align.
#[tokio::test]
async fn gcra_decides_as_the_local_token_bucket() {
    let bucket = TokenBucket::builder(10).burst(5).build().unwrap();
    agree(bucket, 0x9e37_79b9, 150_000, 2).await;
    let bucket = TokenBucket::builder(4)
        .period(Duration::from_millis(10))
        .burst(3)
        .build()
        .unwrap();
    agree(bucket, 7, 4_000, 3).await;
}

#[tokio::test]
async fn sliding_window_decides_as_the_local_one() {
    let window = SlidingWindow::new(10).unwrap();
    agree(window, 0x1234_5678, 150_000, 2).await;
    let window = SlidingWindow::builder(7)
        .window(Duration::from_millis(100))
        .build()
        .unwrap();
    agree(window, 99, 30_000, 3).await;
}

/// A rate whose emission interval has a fraction of a microsecond (300 per second): over a
/// second of steady requests Redis admits what the local bucket admits, within one.
#[tokio::test]
async fn fractional_emission_intervals_keep_the_rate() {
    let server = RedisServer::start();
    let store = RedisStore::new(&server.url()).unwrap();
    let bucket = TokenBucket::builder(300).burst(30).build().unwrap();
    let settings = settings(&bucket);
    let (mut connection, _) = store.connection().unwrap();
    let state = Default::default();
    let origin = 1_700_000_000_000_000_u64;
    let (mut remote_admitted, mut local_admitted) = (0, 0);
    // 3000 requests evenly over 3 s: 10x the rate.
    for i in 0..3_000 {
        let now = origin + i * 1_000;
        local_admitted += u32::from(bucket.check(&state, (now - origin) * 1_000, 1).is_allowed());
        let (decision, _) = remote(&settings, &mut connection, "k", 1, now).await;
        remote_admitted += u32::from(decision.is_allowed());
    }
    // The burst, then one unit per 3.33 ms over the 2.999 s after the first request.
    assert_eq!(local_admitted, 30 + 899);
    assert!(
        remote_admitted.abs_diff(local_admitted) <= 1,
        "redis {remote_admitted}, local {local_admitted}"
    );
}

#[tokio::test]
async fn keys_are_namespaced_and_expire_on_their_own() {
    let server = RedisServer::start();
    let store = RedisStore::new(&server.url()).unwrap();
    let (mut connection, _) = store.connection().unwrap();

    // On the server's clock. 10 per second, burst 5: five units put the TAT 500 ms ahead.
    let bucket = settings(&TokenBucket::builder(10).burst(5).build().unwrap());
    let cmd = command(
        &bucket.scripted,
        &bucket.namespace,
        &keyed("192.0.2.1"),
        ScriptArgs::cost(5),
    );
    evalsha(&mut connection, &cmd, bucket.scripted.code)
        .await
        .unwrap();
    let pttl = |key: &str| -> i64 {
        server
            .command(&format!("PTTL {key}"))
            .trim_start_matches(':')
            .parse()
            .unwrap()
    };
    let ttl = pttl(&format!("test:default:tb:k:{}", name_of("192.0.2.1")));
    assert!((1..=501).contains(&ttl), "PTTL {ttl}");

    // A sliding window of one second: two windows.
    let window = settings(&SlidingWindow::new(10).unwrap());
    let cmd = command(
        &window.scripted,
        &window.namespace,
        &RedisKeyName::Global,
        ScriptArgs::cost(1),
    );
    evalsha(&mut connection, &cmd, window.scripted.code)
        .await
        .unwrap();
    let ttl = pttl("test:default:sw:g");
    assert!((1_000..=2_001).contains(&ttl), "PTTL {ttl}");

    // One per hour, burst 2: a rejection writes nothing, so the key's TTL stays what the
    // last admission set (an hour for each unit ahead).
    let slow = settings(
        &TokenBucket::builder(1)
            .period(Duration::from_secs(3_600))
            .burst(2)
            .build()
            .unwrap(),
    );
    let cmd = command(
        &slow.scripted,
        &slow.namespace,
        &RedisKeyName::Unkeyed,
        ScriptArgs::cost(2),
    );
    evalsha(&mut connection, &cmd, slow.scripted.code)
        .await
        .unwrap();
    let before = pttl("test:default:tb:u");
    let cmd = command(
        &slow.scripted,
        &slow.namespace,
        &RedisKeyName::Unkeyed,
        ScriptArgs::cost(1),
    );
    let reply = evalsha(&mut connection, &cmd, slow.scripted.code)
        .await
        .unwrap();
    assert!(
        matches!(
            slow.scripted.read_reply(&reply, 1).unwrap(),
            ScriptReply::Decided {
                decision: Decision::Reject { .. },
                ..
            }
        ),
        "the burst is spent"
    );
    let after = pttl("test:default:tb:u");
    assert!(
        after <= before && before <= 7_200_001,
        "{before} then {after}"
    );
    assert_eq!(server.command("DBSIZE"), ":3");

    // Time passes on the server's clock: the short-lived keys are gone within two windows.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(server.command("DBSIZE"), ":1");
    assert_eq!(server.command("EXISTS test:default:tb:u"), ":1");
}

/// After `SCRIPT FLUSH` (or a restart) `EVALSHA` answers `NOSCRIPT`; the script is loaded
/// again and the call repeated, invisibly.
#[tokio::test]
async fn scripts_are_loaded_again_after_a_flush() {
    let server = RedisServer::start();
    let store = RedisStore::new(&server.url()).unwrap();
    let (mut connection, _) = store.connection().unwrap();
    let bucket = settings(&TokenBucket::new(10).unwrap());
    let (decision, _) = remote(&bucket, &mut connection, "a", 1, 1).await;
    assert!(decision.is_allowed());
    assert_eq!(server.command("SCRIPT FLUSH"), "+OK");
    let (decision, _) = remote(&bucket, &mut connection, "a", 1, 2).await;
    assert!(decision.is_allowed());
}

/// A regression test of the review's finding: the token bucket's script read the server's
/// clock without a guard, so a step back of D (or a failover to a replica whose clock is
/// D behind) made a key that had spent its burst reject for about D. The sliding window
/// had the same flaw for a full window. Now either rejects for at most one emission
/// interval, or one window.
///
/// The scripts run in a real Redis; the time is the scripts' test argument (ARGV[7]),
/// which stands for the server's clock: Redis offers no way to move its `TIME` without
/// moving the machine's clock, which a test must never do.
#[tokio::test]
async fn a_clock_step_back_does_not_reject_for_its_length() {
    let server = RedisServer::start();
    let store = RedisStore::new(&server.url()).unwrap();
    let (mut connection, _) = store.connection().unwrap();
    let t = 1_700_000_000_000_000_u64;
    let step = 60_000_000; // a minute back
    let second = 1_000_000;

    // 10 per second, bursts of 5: the burst spent at t, then the clock goes back a minute.
    let bucket = settings(&TokenBucket::builder(10).burst(5).build().unwrap());
    for _ in 0..5 {
        assert!(
            remote(&bucket, &mut connection, "a", 1, t)
                .await
                .0
                .is_allowed()
        );
    }
    let (decision, _) = remote(&bucket, &mut connection, "a", 1, t - step).await;
    let Decision::Reject { retry_after } = decision else {
        panic!("the burst was spent just before the step: {decision:?}");
    };
    assert!(
        retry_after <= Duration::from_millis(100),
        "retry after {retry_after:?}, not the minute of the step"
    );
    assert!(
        remote(&bucket, &mut connection, "a", 1, t - step + second / 10)
            .await
            .0
            .is_allowed(),
        "one emission interval after the step"
    );

    // 10 per second in a sliding window: the window full at t, then a minute back.
    let window = settings(&SlidingWindow::new(10).unwrap());
    for _ in 0..10 {
        assert!(
            remote(&window, &mut connection, "b", 1, t)
                .await
                .0
                .is_allowed()
        );
    }
    assert!(
        !remote(&window, &mut connection, "b", 1, t - step)
            .await
            .0
            .is_allowed(),
        "the limit holds across the step"
    );
    let mut admitted = 0;
    // 20 requests within one window, two windows after the step.
    for i in 0..20 {
        let now = t - step + 2 * second + i * 50_000;
        admitted += u32::from(
            remote(&window, &mut connection, "b", 1, now)
                .await
                .0
                .is_allowed(),
        );
    }
    assert_eq!(
        admitted, 10,
        "two windows after the step, a window's quota again"
    );
}

/// A key the call may not make is not made; one Redis holds is decided whatever the cap
/// says; a call that makes its key says so.
#[tokio::test]
async fn keys_are_made_only_when_the_call_allows() {
    let server = RedisServer::start();
    let store = RedisStore::new(&server.url()).unwrap();
    let (mut connection, _) = store.connection().unwrap();
    for limit in [
        settings(&TokenBucket::builder(10).burst(5).build().unwrap()),
        settings(&SlidingWindow::new(10).unwrap()),
    ] {
        let refused = ScriptArgs {
            may_create: false,
            ..at(1, 1_000)
        };
        assert_eq!(
            call(&limit, &mut connection, "new", refused).await,
            ScriptReply::NoSuchKey
        );
        let made = call(&limit, &mut connection, "new", at(1, 1_000)).await;
        assert!(
            matches!(made, ScriptReply::Decided { made: true, .. }),
            "{made:?}"
        );
        let known = call(&limit, &mut connection, "new", refused).await;
        assert!(
            matches!(
                known,
                ScriptReply::Decided {
                    decision: Decision::Allow,
                    made: false,
                    ..
                }
            ),
            "{known:?}"
        );
    }
    let key = format!("test:default:tb:k:{}", name_of("new"));
    assert_eq!(server.command(&format!("EXISTS {key}")), ":1");
}

/// A call that asks for a batch takes what is there, up to what it asked, and the bucket
/// (or window) counts it: the next calls see it gone.
#[tokio::test]
async fn batches_take_what_is_there_and_no_more() {
    let server = RedisServer::start();
    let store = RedisStore::new(&server.url()).unwrap();
    let (mut connection, _) = store.connection().unwrap();
    let with_extra = |extra, now| ScriptArgs {
        extra,
        ..at(1, now)
    };
    for (limit, capacity) in [
        (
            settings(&TokenBucket::builder(10).burst(8).build().unwrap()),
            8,
        ),
        (settings(&SlidingWindow::new(8).unwrap()), 8),
    ] {
        let t = 1_700_000_000_000_000;
        let first = call(&limit, &mut connection, "k", with_extra(5, t)).await;
        let ScriptReply::Decided {
            decision,
            extra,
            status,
            ..
        } = first
        else {
            panic!("{first:?}");
        };
        assert_eq!((decision, extra), (Decision::Allow, 5));
        assert_eq!(status.remaining, capacity - 6);
        let second = call(&limit, &mut connection, "k", with_extra(5, t)).await;
        let ScriptReply::Decided {
            decision,
            extra,
            status,
            ..
        } = second
        else {
            panic!("{second:?}");
        };
        assert_eq!(
            (decision, extra, status.remaining),
            (Decision::Allow, 1, 0),
            "one for the request, the last one for the batch"
        );
        let third = call(&limit, &mut connection, "k", with_extra(5, t)).await;
        assert!(
            matches!(
                third,
                ScriptReply::Decided {
                    decision: Decision::Reject { .. },
                    extra: 0,
                    ..
                }
            ),
            "{third:?}"
        );
    }
}
