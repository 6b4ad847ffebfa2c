//! A TLS store and the process's rustls crypto provider, which is process-wide: a test
//! binary of its own, so that no other test has installed one before, or sees this one.

mod redis_support;

use std::time::Duration;

use ratelimit_layer::RateLimitLayer;
use ratelimit_layer::redis::RedisStore;
use redis_support::{Certificates, GENEROUS, Svc, hourly, ok, send};
use rustls::crypto::CryptoProvider;
use tower::Layer;

/// Regression (issue 30, finding 7): building a TLS store installed ring's provider as the
/// process's default, so that an application that installed its own afterwards (at start,
/// once its layers were built) got an error from `install_default`, and panicked on it.
///
/// A TLS store (and a layer on it) is built: the process still has no provider. The
/// application installs its own, and the store connects with it: the limit is kept in
/// Redis over TLS.
#[tokio::test]
async fn a_tls_store_leaves_the_process_provider_to_the_application() {
    let certificates = Certificates::make("provider");
    let server = certificates.server(false);
    let store = RedisStore::builder(&server.tls_url())
        .ca_certificate(certificates.ca.clone())
        .build()
        .unwrap();
    let svc = Svc::new(
        RateLimitLayer::builder(hourly(3))
            .redis(store.clone())
            .budget(GENEROUS)
            .build()
            .unwrap()
            .layer(ok()),
    );
    assert!(
        CryptoProvider::get_default().is_none(),
        "building a TLS store installed a process-wide provider"
    );

    // The application's own, as it would install it at start.
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("the application installs its provider");
    tokio::time::timeout(Duration::from_secs(5), store.ping())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(send(&svc).await.status(), http::StatusCode::OK);
    assert_eq!(server.command("EXISTS ratelimit:default:tb:g"), ":1");
}
