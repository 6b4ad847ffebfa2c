//! A [`LimitsLayer`]: one live rate limit per entry of a limits file, the request's entry
//! picked by tenant, route and default, changed while serving with every kept entry's state
//! carried over; and watched from a real file.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderMap, Request, Response, StatusCode};
use ratelimit_layer::limits_file::{Limits, LimitsLayer};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt, service_fn};

type Svc = BoxCloneService<Request<()>, Response<()>, Infallible>;

fn service(layer: &LimitsLayer) -> Svc {
    BoxCloneService::new(layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(()))
    })))
}

fn limits(text: &str) -> Limits {
    Limits::parse("limits.toml", text).unwrap()
}

fn request(peer: &str, path: &str, tenant: Option<&str>) -> Request<()> {
    let mut req = Request::get(path).body(()).unwrap();
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    if let Some(tenant) = tenant {
        req.headers_mut()
            .insert("x-tenant", tenant.parse().unwrap());
    }
    req
}

/// Sends `n` requests at once; the admitted count and the last rejection's headers.
async fn send(
    svc: &Svc,
    peer: &str,
    path: &str,
    tenant: Option<&str>,
    n: usize,
) -> (usize, Option<HeaderMap>) {
    let mut admitted = 0;
    let mut rejected = None;
    for _ in 0..n {
        let response = svc
            .clone()
            .oneshot(request(peer, path, tenant))
            .await
            .unwrap();
        match response.status() {
            StatusCode::OK => admitted += 1,
            status => {
                assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
                rejected = Some(response.headers().clone());
            }
        }
    }
    (admitted, rejected)
}

fn policy(headers: &HeaderMap) -> &str {
    headers["ratelimit-policy"].to_str().unwrap()
}

const FILE: &str = r#"
tenant_header = "x-tenant"
[default]
rate = 3
[[route]]
prefix = "/api/"
rate = 2
[[route]]
exact = "/api/health"
rate = 5
[tenant.acme]
rate = 4
"#;

#[tokio::test(start_paused = true)]
async fn each_request_takes_its_tenants_then_its_routes_then_the_default_limit() {
    let layer = LimitsLayer::builder()
        .name("api")
        .build(&limits(FILE))
        .unwrap();
    let svc = service(&layer);
    // The default and the routes: per client IP address.
    assert_eq!(send(&svc, "192.0.2.1:1", "/", None, 10).await.0, 3);
    assert_eq!(send(&svc, "192.0.2.2:1", "/other", None, 10).await.0, 3);
    assert_eq!(send(&svc, "192.0.2.1:1", "/api/items", None, 10).await.0, 2);
    // The exact route wins over the prefix, with a bucket of its own.
    let (n, rejected) = send(&svc, "192.0.2.1:1", "/api/health", None, 10).await;
    assert_eq!(n, 5);
    let rejected = rejected.unwrap();
    assert_eq!(policy(&rejected), r#""api";q=5;w=1"#);
    assert_eq!(rejected["retry-after"], "1");
    // A tenant's limit wins over the route, and is one bucket for the whole tenant.
    assert_eq!(
        send(&svc, "192.0.2.1:1", "/api/items", Some("acme"), 3)
            .await
            .0,
        3
    );
    assert_eq!(
        send(&svc, "192.0.2.2:1", "/api/items", Some("acme"), 3)
            .await
            .0,
        1
    );
    // A tenant the file does not name gets the route's limit.
    assert_eq!(
        send(&svc, "192.0.2.3:1", "/api/items", Some("other"), 10)
            .await
            .0,
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_file_keeps_each_kept_entrys_state_adds_and_drops_entries() {
    let layer = LimitsLayer::builder()
        .name("api")
        .build(&limits("[default]\nrate = 10\n"))
        .unwrap();
    let svc = service(&layer);
    let a = "192.0.2.1:1";
    let (n, rejected) = send(&svc, a, "/", None, 20).await;
    assert_eq!(n, 10);
    assert_eq!(policy(&rejected.unwrap()), r#""api";q=10;w=1"#);
    // Half a second: 5 units back. The rate falls to 1 per second, bursts of 5: the 5
    // units in use stay in use, so nothing now (a fresh bucket would admit 5), then 1 a
    // second. The policy says the new limit.
    tokio::time::advance(Duration::from_millis(500)).await;
    layer
        .apply(&limits("[default]\nrate = 1\nburst = 5\n"))
        .unwrap();
    let (n, rejected) = send(&svc, a, "/", None, 5).await;
    assert_eq!(n, 0);
    let rejected = rejected.unwrap();
    assert_eq!(policy(&rejected), r#""api";q=5;w=5"#);
    assert_eq!(rejected["retry-after"], "1");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(send(&svc, a, "/", None, 5).await.0, 1);
    // Another client gets the new burst.
    assert_eq!(send(&svc, "192.0.2.2:1", "/", None, 10).await.0, 5);

    // An added route: a bucket of its own, fresh.
    layer
        .apply(&limits(
            "[default]\nrate = 1\nburst = 5\n[[route]]\nprefix = \"/new/\"\nrate = 2\n",
        ))
        .unwrap();
    assert_eq!(send(&svc, a, "/new/x", None, 5).await.0, 2);
    assert_eq!(send(&svc, a, "/", None, 5).await.0, 0);
    // Removed: its requests take the default's limit, whose state stayed.
    layer
        .apply(&limits("[default]\nrate = 1\nburst = 5\n"))
        .unwrap();
    assert_eq!(send(&svc, a, "/new/x", None, 5).await.0, 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(send(&svc, a, "/new/x", None, 5).await.0, 1);
    // The default turned global: a new bucket, shared by every client.
    layer
        .apply(&limits(
            "[default]\nrate = 1\nburst = 3\nkey = \"global\"\n",
        ))
        .unwrap();
    assert_eq!(send(&svc, a, "/", None, 2).await.0, 2);
    assert_eq!(send(&svc, "192.0.2.9:1", "/", None, 5).await.0, 1);
    assert_eq!(layer.current().limit_for("/", None).burst(), 3);
}

/// A file of its own in the system's temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let file = Self(
            std::env::temp_dir().join(format!("limits-layer-{}-{name}.toml", std::process::id())),
        );
        file.write(text);
        file
    }

    /// Written whole then renamed over, as an editor saves.
    fn write(&self, text: &str) {
        let tmp = self.0.with_extension("tmp");
        std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The threads of this process named as the limits watcher's.
#[cfg(target_os = "linux")]
fn watcher_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "limits-watcher")
        .count()
}

/// Whether a watcher thread runs, within 2 s: a new thread names itself once it runs.
#[cfg(target_os = "linux")]
async fn a_watcher_runs() -> bool {
    for _ in 0..400 {
        if watcher_threads() == 1 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// Waits up to 5 s (real time) for the layer's limits to satisfy `done`.
async fn until(layer: &LimitsLayer, done: impl Fn(&Limits) -> bool) {
    let start = tokio::time::Instant::now();
    while !done(&layer.current()) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "not in force: {:?}",
            layer.current()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_watched_file_is_put_in_force_and_a_broken_one_changes_nothing() {
    let file = TempFile::new("watched", "[default]\nrate = 2\n");
    let layer = LimitsLayer::builder()
        .name("api")
        .interval(Duration::from_millis(20))
        .watch(&file.0)
        .unwrap();
    #[cfg(target_os = "linux")]
    assert!(a_watcher_runs().await);
    let svc = service(&layer);
    let a = "192.0.2.1:1";
    assert_eq!(send(&svc, a, "/", None, 10).await.0, 2);
    // A new route, and a new default: in force at the watcher's next look.
    file.write("[default]\nrate = 2\n[[route]]\nexact = \"/x\"\nrate = 1000\n");
    until(&layer, |l| l.limit_for("/x", None).rate() == 1000).await;
    assert_eq!(send(&svc, a, "/x", None, 50).await.0, 50);
    // Broken: refused whole, the limits in force stay.
    file.write("[default]\nrate = 0\n[[route]]\nexact = \"/x\"\nrate = 1\n");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(layer.current().limit_for("/x", None).rate(), 1000);
    assert_eq!(send(&svc, a, "/x", None, 50).await.0, 50);
    // Dropping the layer and its services stops the watcher (joined by the drop).
    drop((svc, layer));
    #[cfg(target_os = "linux")]
    assert_eq!(watcher_threads(), 0);
}

#[test]
fn a_file_refused_at_start_says_where() {
    let file = TempFile::new("refused", "[default]\nrate = 10\nburst = 0\n");
    let err = LimitsLayer::from_file(&file.0, "api").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}:3:9: [default]: burst must be at least 1, got 0",
            file.0.display()
        )
    );
    let err = LimitsLayer::builder()
        .name("")
        .build(&limits("[default]\nrate = 1\n"))
        .unwrap_err();
    assert_eq!(err.field(), "name");
}
