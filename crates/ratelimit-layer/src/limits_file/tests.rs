use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use std::time::Duration;

use super::limits::parse_duration;
use super::*;
use crate::algorithm::TokenBucket;

const FILE: &str = r#"
tenant_header = "x-tenant"

[default]
rate = 100

[[route]]
prefix = "/api/"
rate = 50
burst = 10

[[route]]
prefix = "/api/admin/"
rate = 5
period = "1m"

[[route]]
exact = "/api/health"
rate = 1000

[tenant.acme]
rate = 2000
"#;

fn bucket(rate: u32, period: Duration, burst: u32) -> TokenBucket {
    TokenBucket::builder(rate)
        .period(period)
        .burst(burst)
        .build()
        .unwrap()
}

/// A file of its own in the system's temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(text: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "limits-{}-{}.toml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = Self(path);
        file.write(text);
        file
    }

    fn write(&self, text: &str) {
        // Written whole then renamed over, as an editor saves.
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

#[test]
fn a_request_gets_its_tenants_then_its_routes_then_the_default_limit() {
    let limits = Limits::parse("limits.toml", FILE).unwrap();
    let s = Duration::from_secs(1);
    assert_eq!(limits.limit_for("/", None), &bucket(100, s, 100));
    assert_eq!(limits.limit_for("/api/items", None), &bucket(50, s, 10));
    // The longest prefix wins, and an exact route wins over every prefix.
    assert_eq!(
        limits.limit_for("/api/admin/users", None),
        &bucket(5, Duration::from_secs(60), 5)
    );
    assert_eq!(
        limits.limit_for("/api/health", None),
        &bucket(1000, s, 1000)
    );
    assert_eq!(limits.limit_for("/api/health/x", None), &bucket(50, s, 10));
    // A tenant the file names wins over the routes; another gets the routes'.
    assert_eq!(
        limits.limit_for("/api/items", Some("acme")),
        &bucket(2000, s, 2000)
    );
    assert_eq!(
        limits.limit_for("/api/items", Some("other")),
        &bucket(50, s, 10)
    );
    assert_eq!(limits.tenant_header().unwrap(), "x-tenant");
}

#[test]
fn each_entry_says_what_it_keys_by_and_which_entry_a_request_takes() {
    use crate::config::KeyBy;
    let limits = Limits::parse("limits.toml", FILE).unwrap();
    // Routes and the default per client IP, tenants global, unless the file says.
    let key = |path, tenant| {
        let (id, limit) = limits.entry_for(path, tenant);
        (id.to_string(), limit.key)
    };
    assert_eq!(key("/", None), ("default".to_owned(), KeyBy::Ip));
    assert_eq!(
        key("/api/admin/x", None),
        ("route prefix \"/api/admin/\"".to_owned(), KeyBy::Ip)
    );
    assert_eq!(
        key("/api/health", None),
        ("route exact \"/api/health\"".to_owned(), KeyBy::Ip)
    );
    assert_eq!(
        key("/", Some("acme")),
        ("tenant \"acme\"".to_owned(), KeyBy::Global)
    );
    assert_eq!(limits.entries().count(), 5);
    let changed = Limits::parse(
        "limits.toml",
        "[default]\nrate = 100\nkey = \"global\"\n[tenant.acme]\nrate = 1\nkey = \"ip\"\n",
    );
    // A tenant needs the header; the key is read before that is checked.
    assert!(changed.is_err());
    let a = Limits::parse("l.toml", "[default]\nrate = 100\n").unwrap();
    let b = Limits::parse("l.toml", "[default]\nrate = 100\nkey = \"global\"\n").unwrap();
    assert_eq!(
        a.changes(&b),
        ["default: 100/1s burst 100 -> 100/1s burst 100, global"]
    );
}

#[test]
fn every_error_names_the_line_the_column_and_what_is_wrong() {
    let err = |text: &str| Limits::parse("l.toml", text).unwrap_err().to_string();
    assert_eq!(
        err("[default]\nrate = 10\n\n[[route]]\nprefix = \"/a\"\nrate = 0\n"),
        "l.toml:6:8: [[route]] \"/a\": rate must be at least 1, got 0"
    );
    assert_eq!(
        err("[default]\nrate = 10\nburts = 3\n"),
        "l.toml:3:1: unknown field `burts`, expected one of `rate`, `period`, `burst`, `key`"
    );
    assert_eq!(
        err("[default]\nrate = \"ten\"\n"),
        "l.toml:2:8: invalid type: string \"ten\", expected u32"
    );
    assert_eq!(
        err("[default\nrate = 1\n")
            .split(':')
            .take(3)
            .collect::<Vec<_>>(),
        ["l.toml", "1", "9"]
    );
    assert_eq!(
        err("tenant_header = \"x\"\n"),
        "l.toml:1:1: missing field `default`"
    );
    assert_eq!(
        err("rate = 1\n[default]\nrate = 1\n"),
        "l.toml:1:1: unknown field `rate`, expected one of `tenant_header`, `default`, `route`, `tenant`"
    );
    assert_eq!(
        err("[default]\nrate = 1\nperiod = \"1 fortnight\"\n"),
        "l.toml:3:10: [default]: period: cannot read \"1 fortnight\" as a duration such as \"1s\" or \"250ms\""
    );
    assert_eq!(
        err("[default]\nrate = 1\n[[route]]\nexact = \"/a\"\nprefix = \"/b\"\nrate = 1\n"),
        "l.toml:3:1: [[route]]: set exactly one of `exact` and `prefix`"
    );
    assert_eq!(
        err("[default]\nrate = 1\n[[route]]\nprefix = \"a\"\nrate = 1\n"),
        "l.toml:3:1: [[route]] \"a\": a route's path must start with '/'"
    );
    assert_eq!(
        err(
            "[default]\nrate = 1\n[[route]]\nexact = \"/a\"\nrate = 1\n[[route]]\nexact = \"/a\"\nrate = 2\n"
        ),
        "l.toml:6:1: [[route]] \"/a\": set twice"
    );
    assert_eq!(
        err("[default]\nrate = 1\nburst = 0\n"),
        "l.toml:3:9: [default]: burst must be at least 1, got 0"
    );
    assert_eq!(
        err("[default]\nrate = 1\n[tenant.acme]\nrate = 1\n"),
        "l.toml:3:1: [tenant.acme]: tenants need `tenant_header`, the header naming them"
    );
    assert_eq!(
        err("tenant_header = \"x tenant\"\n[default]\nrate = 1\n"),
        "l.toml:1:17: tenant_header: \"x tenant\" is not a header name"
    );
    assert_eq!(
        err("[default]\nrate = 1\nkey = \"user\"\n"),
        "l.toml:3:7: [default]: key: \"user\" is neither \"ip\" (each client IP address) nor \"global\" (all together)"
    );
    let unreadable =
        Limits::load(std::env::temp_dir().join("no-such-limits-file.toml")).unwrap_err();
    assert_eq!(unreadable.position(), None);
    assert!(
        unreadable.message().starts_with("cannot read: "),
        "{unreadable}"
    );
}

#[test]
fn durations_read_as_a_number_and_a_unit() {
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("2 s"), Some(Duration::from_secs(2)));
    assert_eq!(parse_duration("1m"), Some(Duration::from_secs(60)));
    assert_eq!(parse_duration("3h"), Some(Duration::from_secs(10_800)));
    assert_eq!(parse_duration("7us"), Some(Duration::from_micros(7)));
    assert_eq!(parse_duration("7ns"), Some(Duration::from_nanos(7)));
    assert_eq!(parse_duration("s"), None);
    assert_eq!(parse_duration("5"), None);
    assert_eq!(parse_duration("-5s"), None);
    assert_eq!(parse_duration(&format!("{}h", u64::MAX)), None);
}

/// The reload counter's value for `result`, read from `recorder`'s snapshot.
fn reloads(snapshot: &[(String, String, u64)], result: &str) -> u64 {
    snapshot
        .iter()
        .filter(|(name, r, _)| name == "api" && r == result)
        .map(|(_, _, n)| n)
        .sum()
}

#[test]
fn a_rewritten_file_is_reloaded_and_a_broken_one_changes_nothing_and_says_why() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let logs = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink = Arc::clone(&logs);
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || LogSink(Arc::clone(&sink)))
        .finish();
    let _logs = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    let counters = || {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let key = key.key();
                (key.name() == RELOADS_TOTAL).then(|| {
                    let label = |l: &str| {
                        key.labels()
                            .find(|x| x.key() == l)
                            .map(|x| x.value().to_owned())
                            .unwrap_or_default()
                    };
                    let DebugValue::Counter(n) = value else {
                        panic!("{value:?}")
                    };
                    (label("name"), label("result"), n)
                })
            })
            .collect::<Vec<_>>()
    };

    let file = TempFile::new("[default]\nrate = 100\n");
    let mut reloader = Reloader::new(&file.0, "api").unwrap();
    assert_eq!(reloader.poll(), ReloadOutcome::Unchanged);
    file.write("[default]\nrate = 10\n[[route]]\nprefix = \"/a\"\nrate = 1\n");
    let ReloadOutcome::Applied(limits) = reloader.poll() else {
        panic!("not applied")
    };
    assert_eq!(limits.limit_for("/", None).rate(), 10);
    assert_eq!(reloader.current().limit_for("/a", None).rate(), 1);
    let log = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(log.contains("limits file reloaded"), "{log}");
    assert!(
        log.contains("default: 100/1s burst 100 -> 10/1s burst 10"),
        "{log}"
    );
    assert!(
        log.contains("route prefix \"/a\": 1/1s burst 1 added"),
        "{log}"
    );
    assert_eq!(reloads(&counters(), "applied"), 1);

    // A broken file: refused, once, with its line; the limits in force stay.
    file.write("[default]\nrate = 0\n");
    let ReloadOutcome::Refused(err) = reloader.poll() else {
        panic!("not refused")
    };
    assert_eq!(err.position(), Some((2, 8)));
    assert_eq!(reloader.poll(), ReloadOutcome::Unchanged);
    assert_eq!(reloader.current().limit_for("/", None).rate(), 10);
    let log = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(log.contains("WARN"), "{log}");
    assert!(
        log.contains("limits file refused, the limits in force are kept"),
        "{log}"
    );
    assert!(log.contains("rate must be at least 1, got 0"), "{log}");
    // A file gone (mid-swap) is refused the same way.
    std::fs::remove_file(&file.0).unwrap();
    assert!(matches!(reloader.poll(), ReloadOutcome::Refused(_)));
    assert_eq!(reloader.poll(), ReloadOutcome::Unchanged);
    let counted = counters();
    assert_eq!(reloads(&counted, "refused"), 1, "{counted:?}");
    assert_eq!(reloads(&counted, "unreadable"), 1, "{counted:?}");
    // Fixed again: applied.
    file.write("[default]\nrate = 20\n");
    assert!(matches!(reloader.poll(), ReloadOutcome::Applied(_)));
    assert_eq!(reloader.current().limit_for("/", None).rate(), 20);
}

#[cfg(unix)]
#[test]
fn the_watcher_follows_a_symbolic_link_swapped_as_a_config_map_volume_does() {
    // A `ConfigMap` volume: `limits.toml -> ..data/limits.toml`, `..data -> ..v1`; an update
    // writes `..v2` and swaps the `..data` link.
    let dir = std::env::temp_dir().join(format!("limits-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("..v1")).unwrap();
    std::fs::create_dir_all(dir.join("..v2")).unwrap();
    std::fs::write(dir.join("..v1/limits.toml"), "[default]\nrate = 100\n").unwrap();
    std::fs::write(dir.join("..v2/limits.toml"), "[default]\nrate = 7\n").unwrap();
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/limits.toml", dir.join("limits.toml")).unwrap();

    let reloader = Reloader::new(dir.join("limits.toml"), "api").unwrap();
    let (sent, applied) = std::sync::mpsc::channel();
    let watcher = LimitsWatcher::start(reloader, Duration::from_millis(20), move |limits| {
        let _ = sent.send(limits.limit_for("/", None).rate());
    });
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    assert_eq!(applied.recv_timeout(Duration::from_secs(5)), Ok(7));
    drop(watcher);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `tracing` writer into a shared buffer.
struct LogSink(Arc<Mutex<Vec<u8>>>);

impl Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
