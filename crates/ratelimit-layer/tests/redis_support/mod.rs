//! What the Redis tests share: a service to limit, stores, the Redis metrics read back, and
//! certificates made in-process for TLS.

#![allow(dead_code)] // each test file uses its own part

use std::convert::Infallible;
use std::path::PathBuf;
use std::time::Duration;

use http::{Request, Response};
use metrics_util::debugging::{DebugValue, Snapshotter};
use ratelimit_layer::redis::RedisStore;
use ratelimit_layer::redis::testing::RedisServer;
use ratelimit_layer::{TokenBucket, metric_names};
use tower::{ServiceExt, service_fn};

pub(crate) type Svc = tower::util::BoxCloneService<Request<()>, Response<String>, Infallible>;

pub(crate) fn ok() -> Svc {
    Svc::new(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new("ok".to_owned()))
    }))
}

/// One per hour, bursts of `burst`: nothing comes back during a test.
pub(crate) fn hourly(burst: u32) -> TokenBucket {
    TokenBucket::builder(1)
        .period(Duration::from_secs(3_600))
        .burst(burst)
        .build()
        .unwrap()
}

/// A store as a separate process would have it, reconnecting quickly, connected.
pub(crate) async fn store(server: &RedisServer) -> RedisStore {
    let store = RedisStore::builder(&server.url())
        .reconnect_max_delay(Duration::from_millis(50))
        .build()
        .unwrap();
    store.ping().await.unwrap();
    store
}

/// A budget for the tests that are not about it: long enough for a loaded machine, so that
/// they see Redis's decisions, never the fallback's.
pub(crate) const GENEROUS: Duration = Duration::from_secs(2);

pub(crate) async fn send(svc: &Svc) -> Response<String> {
    svc.clone().oneshot(Request::new(())).await.unwrap()
}

pub(crate) fn header<'a>(response: &'a Response<String>, name: &http::HeaderName) -> &'a str {
    response.headers()[name].to_str().unwrap()
}

/// What the Redis metrics said since the previous reading (the debugging recorder's
/// snapshot drains what it reads, gauges included, so each reading takes one).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Reading {
    /// Fallbacks by reason: timeout, error, unavailable.
    pub(crate) fallbacks: [u64; 3],
    /// The `up` gauge, when it was set since the previous reading.
    pub(crate) up: Option<f64>,
    /// Rejections by key class: global, keyed, overflow, unkeyed.
    pub(crate) rejected: [u64; 4],
}

pub(crate) fn read(snapshotter: &Snapshotter) -> Reading {
    let mut reading = Reading::default();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        match value {
            DebugValue::Counter(n) if key.name() == metric_names::REDIS_FALLBACKS => {
                let reason = label("reason");
                let slot = ["timeout", "error", "unavailable"]
                    .iter()
                    .position(|r| *r == reason)
                    .unwrap();
                reading.fallbacks[slot] += n;
            }
            DebugValue::Counter(n) if key.name() == metric_names::REQUESTS_REJECTED => {
                let class = label("key_class");
                let slot = ["global", "keyed", "overflow", "unkeyed"]
                    .iter()
                    .position(|c| *c == class)
                    .unwrap();
                reading.rejected[slot] += n;
            }
            DebugValue::Gauge(g) if key.name() == metric_names::REDIS_UP => {
                reading.up = Some(g.into_inner());
            }
            _ => {}
        }
    }
    reading
}

/// A CA, a server certificate for 127.0.0.1 and `localhost` signed by it, and a client
/// certificate signed by it: PEM files in a directory of their own, removed on drop.
/// Made in-process with rcgen, so that the tests need no `openssl` binary.
pub(crate) struct Certificates {
    pub(crate) dir: PathBuf,
    /// The CA's certificate, PEM.
    pub(crate) ca: Vec<u8>,
    pub(crate) client_certificate: Vec<u8>,
    pub(crate) client_key: Vec<u8>,
}

impl Certificates {
    pub(crate) fn make(name: &str) -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            SanType,
        };
        let dir =
            std::env::temp_dir().join(format!("ratelimit-layer-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "ratelimit-layer test CA");
        let ca = ca.self_signed(&ca_key).unwrap();

        let server_key = KeyPair::generate().unwrap();
        let mut server = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        server
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = server.signed_by(&server_key, &ca, &ca_key).unwrap();

        let client_key = KeyPair::generate().unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(DnType::CommonName, "ratelimit-layer test client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client = client.signed_by(&client_key, &ca, &ca_key).unwrap();

        let this = Self {
            ca: ca.pem().into_bytes(),
            client_certificate: client.pem().into_bytes(),
            client_key: client_key.serialize_pem().into_bytes(),
            dir,
        };
        std::fs::write(this.path("ca.pem"), &this.ca).unwrap();
        std::fs::write(this.path("server.pem"), server.pem()).unwrap();
        std::fs::write(this.path("server.key"), server_key.serialize_pem()).unwrap();
        this
    }

    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// A `redis-server` with TLS on a second port, presenting the server certificate, and
    /// asking clients for a certificate of this CA when `auth_clients`.
    pub(crate) fn server(&self, auth_clients: bool) -> RedisServer {
        RedisServer::start_tls(
            &self.path("server.pem"),
            &self.path("server.key"),
            &self.path("ca.pem"),
            auth_clients,
        )
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
