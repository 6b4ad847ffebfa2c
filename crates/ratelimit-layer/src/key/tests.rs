use std::borrow::Cow;
use std::hash::Hasher;
use std::net::{IpAddr, SocketAddr};

use http::request::Parts;
use http::{HeaderName, Request};
use overload_signal::signal::CallerKey;

use super::*;

fn parts(peer: &str, headers: &[(&str, &str)]) -> Parts {
    let mut builder = Request::builder();
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let mut req = builder.body(()).unwrap();
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req.into_parts().0
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn forwarding_headers_are_ignored_by_default() {
    let p = parts("203.0.113.9:5000", &[("x-forwarded-for", "1.2.3.4")]);
    assert_eq!(ClientIp::new().client_ip(&p), Some(ip("203.0.113.9")));
    let p = parts("203.0.113.9:5000", &[("forwarded", "for=1.2.3.4")]);
    assert_eq!(ClientIp::default().client_ip(&p), Some(ip("203.0.113.9")));
}

#[test]
fn x_forwarded_for_behind_trusted_proxies() {
    let c = ClientIp::builder()
        .trust_proxies(
            ForwardedHeader::XForwardedFor,
            ["10.0.0.0/8".parse().unwrap()],
        )
        .build()
        .unwrap();
    // The client forged the first entry; the proxy appended the real address.
    let p = parts(
        "10.0.0.2:80",
        &[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.1")],
    );
    assert_eq!(c.client_ip(&p), Some(ip("198.51.100.7")));
    // Several header lines are one list, in order.
    let p = parts(
        "10.0.0.2:80",
        &[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "198.51.100.7:4711"),
        ],
    );
    assert_eq!(c.client_ip(&p), Some(ip("198.51.100.7")));
    // An untrusted peer's header is ignored.
    let p = parts("198.51.100.1:80", &[("x-forwarded-for", "6.6.6.6")]);
    assert_eq!(c.client_ip(&p), Some(ip("198.51.100.1")));
    // Junk stops the walk at the last trusted hop.
    let p = parts("10.0.0.2:80", &[("x-forwarded-for", "junk, 10.0.0.1")]);
    assert_eq!(c.client_ip(&p), Some(ip("10.0.0.1")));
    // No header: the proxy itself.
    let p = parts("10.0.0.2:80", &[]);
    assert_eq!(c.client_ip(&p), Some(ip("10.0.0.2")));
    // The other header is not read.
    let p = parts("10.0.0.2:80", &[("forwarded", "for=1.2.3.4")]);
    assert_eq!(c.client_ip(&p), Some(ip("10.0.0.2")));
}

#[test]
fn forwarded_behind_trusted_proxies() {
    let c = ClientIp::builder()
        .trust_proxies(ForwardedHeader::Forwarded, ["10.0.0.1".parse().unwrap()])
        .build()
        .unwrap();
    let p = parts(
        "10.0.0.1:80",
        &[(
            "forwarded",
            "for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https, For=10.0.0.1",
        )],
    );
    assert_eq!(c.client_ip(&p), Some(ip("2001:db8:cafe::")));
    let p = parts("10.0.0.1:80", &[("forwarded", "for=unknown")]);
    assert_eq!(c.client_ip(&p), Some(ip("10.0.0.1")));
    let p = parts(
        "10.0.0.1:80",
        &[("forwarded", "proto=http;for=192.0.2.43:80")],
    );
    assert_eq!(c.client_ip(&p), Some(ip("192.0.2.43")));
}

#[test]
fn ipv6_is_keyed_by_prefix() {
    let p = parts("[2001:db8:1:2:3:4:5:6]:443", &[]);
    assert_eq!(
        ClientIp::default().client_ip(&p),
        Some(ip("2001:db8:1:2::"))
    );
    let exact = ClientIp::builder().ipv6_prefix(128).build().unwrap();
    assert_eq!(exact.client_ip(&p), Some(ip("2001:db8:1:2:3:4:5:6")));
    let err = ClientIp::builder().ipv6_prefix(129).build().unwrap_err();
    assert_eq!(err.field(), "ipv6_prefix");
    assert_eq!(err.to_string(), "ipv6_prefix must be at most 128, got 129");
    // A custom extension and trusted proxies survive the other setters.
    #[derive(Clone)]
    struct Peer(SocketAddr);
    let c = ClientIp::builder()
        .peer_from_extension(|p: &Peer| Some(p.0))
        .ipv6_prefix(48)
        .build()
        .unwrap();
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(Peer("[2001:db8:1:2::9]:1".parse().unwrap()));
    assert_eq!(c.client_ip(&req.into_parts().0), Some(ip("2001:db8:1::")));
    // IPv4-mapped addresses are IPv4.
    let p = parts("[::ffff:192.0.2.1]:443", &[]);
    assert_eq!(ClientIp::default().client_ip(&p), Some(ip("192.0.2.1")));
}

#[test]
fn other_extensions_and_missing_ones() {
    #[derive(Clone)]
    struct ConnectInfo(SocketAddr);
    let c = ClientIp::from_extension(|ci: &ConnectInfo| Some(ci.0));
    let mut req = Request::new(());
    assert_eq!(c.client_ip(&req.clone().into_parts().0), None);
    req.extensions_mut()
        .insert(ConnectInfo("192.0.2.8:1".parse().unwrap()));
    assert_eq!(c.client_ip(&req.into_parts().0), Some(ip("192.0.2.8")));
}

/// Issue 31, finding 8: `ClientIp::new` reads the plain contract, a `SocketAddr` extension
/// (which the adapters copy from axum's and tonic's connect info), and no framework's type:
/// an application on another major version of a framework is keyed the same way. (Issue 23,
/// finding 1, had it read axum 0.8's and tonic 0.14's types directly.)
#[cfg(not(loom))]
#[test]
fn the_default_client_ip_reads_the_socket_addr_extension_only() {
    let c = ClientIp::new();
    let mut req = Request::new(());
    req.extensions_mut().insert(axum::extract::ConnectInfo(
        "192.0.2.9:1".parse::<SocketAddr>().unwrap(),
    ));
    req.extensions_mut()
        .insert(tonic::transport::server::TcpConnectInfo {
            local_addr: None,
            remote_addr: Some("198.51.100.3:50000".parse().unwrap()),
        });
    assert_eq!(c.client_ip(&req.clone().into_parts().0), None);
    req.extensions_mut()
        .insert("203.0.113.4:1".parse::<SocketAddr>().unwrap());
    assert_eq!(c.client_ip(&req.into_parts().0), Some(ip("203.0.113.4")));
}

#[test]
fn header_keys_are_borrowed_from_the_request() {
    let extract = HeaderKey::new(HeaderName::from_static("x-api-key"));
    let p = parts("192.0.2.1:1", &[("x-api-key", "abc")]);
    let key = extract.extract(&p).unwrap();
    assert!(matches!(key, Cow::Borrowed(b"abc")), "not copied");
    assert_eq!(extract.extract(&parts("192.0.2.1:1", &[])), None);
    let long = "k".repeat(HeaderKey::MAX_LEN + 1);
    assert!(
        extract
            .extract(&parts("192.0.2.1:1", &[("x-api-key", &long)]))
            .is_some(),
        "a long value is a key (hashed), not a missing one"
    );
    let longest = "k".repeat(HeaderKey::MAX_LEN);
    assert!(
        extract
            .extract(&parts("192.0.2.1:1", &[("x-api-key", &longest)]))
            .is_some()
    );
}

#[test]
fn missing_key_defaults_and_caller_keys() {
    let header = HeaderKey::new(HeaderName::from_static("x-api-key"));
    assert_eq!(ClientIp::new().missing_key(), MissingKey::Reject);
    assert_eq!(header.missing_key(), MissingKey::Shared);
    let closure = |parts: &Parts| Some(parts.uri.path().to_owned());
    assert_eq!(closure.missing_key(), MissingKey::Reject);
    assert_eq!(
        [MissingKey::Reject, MissingKey::Shared, MissingKey::Bypass].map(MissingKey::as_str),
        ["reject", "shared", "bypass"]
    );
    // As caller keys for the overload layer: the same key, or none, as for the limit.
    let hash = |key: &dyn CallerKey, parts: &Parts| {
        let mut h = std::hash::DefaultHasher::new();
        key.hash_key(parts, &mut h).then(|| h.finish())
    };
    let a = parts("192.0.2.1:1", &[("x-api-key", "k1")]);
    let b = parts("192.0.2.1:2", &[("x-api-key", "k2")]);
    let c = parts("192.0.3.2:1", &[]);
    let same_network = parts("192.0.2.2:1", &[]);
    assert_eq!(hash(&ClientIp::new(), &a), hash(&ClientIp::new(), &b));
    assert_ne!(hash(&ClientIp::new(), &a), hash(&ClientIp::new(), &c));
    // The overload layer classes callers by network: one /24 is one caller there.
    assert_eq!(
        hash(&ClientIp::new(), &a),
        hash(&ClientIp::new(), &same_network)
    );
    assert_eq!(
        hash(&ClientIp::new(), &Request::new(()).into_parts().0),
        None
    );
    assert_ne!(hash(&header, &a), hash(&header, &b));
    assert_eq!(hash(&header, &c), None);
}

#[test]
fn closures_and_client_ips_are_extractors() {
    let p = parts("192.0.2.7:1", &[("x-tenant", "t1")]);
    let by_path = |parts: &Parts| Some(parts.uri.path().to_owned());
    assert_eq!(by_path.extract(&p).as_deref(), Some(&"/".to_owned()));
    assert_eq!(
        ClientIp::new().extract(&p).as_deref(),
        Some(&ip("192.0.2.7"))
    );
}

/// Regression (issue 30, review item D3): `trust_proxies` and `proxies` (now
/// `trusted_proxies`, as the getter and the overload layer's setter) set one setting, and
/// the last call won silently.
#[test]
fn the_proxies_set_two_ways_are_refused() {
    use crate::key::{ForwardedHeader, TrustedProxies};
    let checked = TrustedProxies::new(
        ForwardedHeader::XForwardedFor,
        ["10.0.0.1".parse().unwrap()],
    )
    .unwrap();
    let err = ClientIp::builder()
        .trust_proxies(ForwardedHeader::Forwarded, ["10.0.0.2".parse().unwrap()])
        .trusted_proxies(checked.clone())
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "trusted_proxies");
    assert_eq!(err.kind(), crate::ConfigErrorKind::Conflict);
    let one = ClientIp::builder()
        .trusted_proxies(checked)
        .build()
        .unwrap();
    assert!(one.trusted_proxies().is_some());
}

/// Issue 31, finding 9: a value over `MAX_LEN` (a JWT of 1 200 bytes) is keyed by its
/// SHA-256 digest: the same token the same key, two tokens two keys, in every process (no
/// per-process seed), and never the key of a short value.
#[test]
fn long_header_values_are_keyed_by_their_digest() {
    let extract = HeaderKey::new(HeaderName::from_static("authorization"));
    let token = |last: char| format!("Bearer {}{last}", "e".repeat(1_192));
    let key = |value: &str| {
        extract
            .extract(&parts("192.0.2.1:1", &[("authorization", value)]))
            .map(Cow::into_owned)
    };
    let a = key(&token('A')).expect("a 1 200-byte token is a key");
    let b = key(&token('B')).expect("a 1 200-byte token is a key");
    assert_ne!(a, b, "two tokens, two keys");
    assert_eq!(key(&token('A')).unwrap(), a, "the same token, the same key");
    assert!(
        a.len() <= HeaderKey::MAX_LEN,
        "a bounded key: {} bytes",
        a.len()
    );
    // The digest is not a per-process hash: the same bytes in every process of a fleet.
    assert_eq!(
        a,
        header::digest_key(token('A').as_bytes()),
        "the documented form"
    );
    // A short value is never taken for a hashed one: no header value holds a NUL byte.
    assert_eq!(a[0], 0);
    assert!(http::HeaderValue::from_bytes(&a).is_err());
}
