//! The store's settings checked, without a Redis.

use super::*;

#[test]
fn urls_are_checked_and_passwords_never_printed() {
    let store = RedisStore::new("redis://:hunter2@127.0.0.1:6390/1").unwrap();
    assert_eq!(store.addr(), "127.0.0.1:6390");
    assert!(!store.is_cluster());
    let debug = format!("{store:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    let builder = RedisStore::builder("redis://:hunter2@127.0.0.1");
    assert!(!format!("{builder:?}").contains("hunter2"));

    for bad in [
        "http://127.0.0.1:6379",
        "127.0.0.1:6379",
        "",
        "redis://:hunter2@[::1",
        "rediss://:hunter2@127.0.0.1:6390/#insecure",
    ] {
        let err = RedisStore::new(bad).unwrap_err();
        assert_eq!(
            (err.field(), err.kind()),
            ("url", ConfigErrorKind::Invalid),
            "{bad}"
        );
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
    let err = RedisStore::builder("redis://127.0.0.1")
        .reconnect_max_delay(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "reconnect_max_delay must be greater than zero, got 0ns"
    );
    let err = RedisStore::builder("redis://127.0.0.1")
        .response_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "response_timeout");
}

/// A regression test of the trial's first finding: `rediss://` was refused as "not a
/// Redis URL".
#[test]
fn tls_urls_are_taken_and_certificates_checked() {
    let store = RedisStore::new("rediss://:hunter2@redis.example.com:6380").unwrap();
    assert_eq!(store.addr(), "redis.example.com:6380");
    let err = RedisStore::builder("rediss://127.0.0.1:6380")
        .ca_certificate("not a certificate")
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "ca_certificate must hold at least one PEM certificate, got none"
    );
    let err = RedisStore::builder("redis://127.0.0.1:6380")
        .ca_certificate("-----BEGIN CERTIFICATE-----")
        .build()
        .unwrap_err();
    assert_eq!(
        (err.field(), err.kind()),
        ("ca_certificate", ConfigErrorKind::Conflict)
    );
    assert_eq!(err.to_string(), "ca_certificate needs TLS: a rediss:// URL");
}

#[test]
fn clusters_take_seeds_that_agree() {
    let store = RedisStore::cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]).unwrap();
    assert!(store.is_cluster());
    assert_eq!(store.addr(), "127.0.0.1:7000,127.0.0.1:7001");
    let err = RedisStore::cluster(Vec::<String>::new()).unwrap_err();
    assert_eq!(err.field(), "seeds");
    let err =
        RedisStore::cluster(["redis://127.0.0.1:7000", "rediss://127.0.0.1:7001"]).unwrap_err();
    assert_eq!(err.field(), "seeds");
    let err = RedisStore::cluster(["redis+unix:///tmp/redis.sock"]).unwrap_err();
    assert_eq!(err.field(), "url");
    let err = RedisStore::cluster(["redis://:a@127.0.0.1:7000", "redis://:b@127.0.0.1:7001"])
        .unwrap_err();
    assert_eq!(err.field(), "seeds");
    assert!(!err.to_string().contains(":a@"), "{err}");
    let err = RedisStore::cluster(["redis://127.0.0.1:7000/3"]).unwrap_err();
    assert_eq!(err.field(), "url");
}

/// A Cluster connection made anew (after the old one went silent) starts from the
/// nodes the Cluster last named as well as the seeds: a seed that was the lost node
/// does not leave the store without a way in.
#[test]
fn a_cluster_remembers_the_nodes_it_was_told_of() {
    use redis::Value;
    let store = RedisStore::cluster(["redis://127.0.0.1:7000"]).unwrap();
    let node = |host: &str, port: i64| {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    };
    let range = |start: i64, end: i64, nodes: Vec<Value>| {
        let mut items = vec![Value::Int(start), Value::Int(end)];
        items.extend(nodes);
        Value::Array(items)
    };
    store.learn_nodes(&Value::Array(vec![
        range(
            0,
            5460,
            vec![node("127.0.0.1", 7000), node("127.0.0.1", 7003)],
        ),
        range(5461, 10922, vec![node("127.0.0.1", 7001), node("", 7004)]),
        range(10923, 16383, vec![node("127.0.0.1", 7001)]),
    ]));
    let RedisTopology::Cluster { known, .. } = store.inner.connections.target() else {
        panic!("a Cluster");
    };
    assert_eq!(
        *known.lock().unwrap(),
        [
            ("127.0.0.1".to_owned(), 7000),
            ("127.0.0.1".to_owned(), 7003),
            ("127.0.0.1".to_owned(), 7001),
        ]
    );
    // A reply of another shape changes nothing.
    store.learn_nodes(&Value::Okay);
    assert_eq!(known.lock().unwrap().len(), 3);
}

#[test]
fn outside_a_runtime_the_connection_is_an_error_not_a_panic() {
    let store = RedisStore::new("redis://127.0.0.1:6390").unwrap();
    assert!(store.connection().is_err());
    let store = RedisStore::cluster(["redis://127.0.0.1:6390"]).unwrap();
    assert!(store.connection().is_err());
}

/// Regression (issue 30, finding 7): `Unreachable` wrote its source's text into its own
/// message and returned that source from `source()`, so a reporter that walks the chain
/// (anyhow's `{:#}`, tracing's error fields) printed it twice.
#[test]
fn unreachable_says_its_source_once_in_a_chain() {
    use std::error::Error;
    let error = Unreachable(RedisError::from((
        redis::ErrorKind::Io,
        "connection refused by 127.0.0.1:6390",
    )));
    let chain: Vec<String> = std::iter::successors(Some(&error as &dyn Error), |&e| e.source())
        .map(ToString::to_string)
        .collect();
    let printed = chain.join(": ");
    assert_eq!(chain.len(), 2, "{printed}");
    assert_eq!(
        printed.matches("connection refused").count(),
        1,
        "{printed}"
    );
    assert_eq!(chain[0], "Redis does not answer");
}
