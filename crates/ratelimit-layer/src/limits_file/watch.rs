//! Reloading the limits file when it changes: [`Reloader`] (one look at the file) and
//! [`LimitsWatcher`] (a thread looking every 250 ms).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use overload_core::telemetry::NAME_LABEL;
use sha2::{Digest, Sha256};

use super::limits::{Limits, LimitsFileError};

/// The counter of reloads: [`metric_names::LIMITS_RELOADS`](crate::metric_names::LIMITS_RELOADS).
pub const RELOADS_TOTAL: &str = crate::metric_names::LIMITS_RELOADS;

/// What the file was when last looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Content([u8; 32]),
    Unreadable(String),
}

/// What one look at the file found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum ReloadOutcome {
    /// The same content (or the same read error) as the last look: nothing to do.
    Unchanged,
    /// New content, valid: these limits are now in force.
    Applied(Limits),
    /// New content with an error, or the file cannot be read: the limits in force stay.
    Refused(LimitsFileError),
}

/// Looks at the limits file and reloads it when its content changed, keeping the limits in
/// force when the new content is refused.
///
/// Each look reads the whole file and compares its SHA-256 with the last look's: this sees
/// every change on every file system, including an edit within the modification time's
/// granularity and the symbolic link swap of a Kubernetes `ConfigMap` volume (the link's
/// target changes, not the file), at the cost of reading a small file. A change is logged
/// with `tracing` (each limit that changed, or why the file was refused, once per content)
/// and counted in [`RELOADS_TOTAL`] with the layer's `name`.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    name: String,
    current: Limits,
    seen: Seen,
}

impl Reloader {
    /// Loads the file at `path` for the layer named `name` (the metric's `name` label).
    ///
    /// # Errors
    ///
    /// The file is refused: a server should not start with limits it cannot read.
    pub fn new(path: impl AsRef<Path>, name: impl Into<String>) -> Result<Self, LimitsFileError> {
        let path = path.as_ref().to_owned();
        let bytes = std::fs::read(&path).map_err(|e| LimitsFileError {
            path: path.clone(),
            position: None,
            message: format!("cannot read: {e}"),
        })?;
        let current = Limits::parse(&path, &String::from_utf8_lossy(&bytes))?;
        Ok(Self {
            path,
            name: name.into(),
            current,
            seen: Seen::Content(Sha256::digest(&bytes).into()),
        })
    }

    /// The limits in force.
    pub fn current(&self) -> &Limits {
        &self.current
    }

    /// Looks at the file once.
    pub fn poll(&mut self) -> ReloadOutcome {
        let (seen, parsed) = match std::fs::read(&self.path) {
            Ok(bytes) => {
                let seen = Seen::Content(Sha256::digest(&bytes).into());
                if seen == self.seen {
                    return ReloadOutcome::Unchanged;
                }
                let parsed = match String::from_utf8(bytes) {
                    Ok(text) => Limits::parse(&self.path, &text),
                    Err(e) => Err(LimitsFileError {
                        path: self.path.clone(),
                        position: None,
                        message: format!("not UTF-8: {e}"),
                    }),
                };
                (seen, parsed.map_err(|e| (e, "refused")))
            }
            Err(e) => {
                let seen = Seen::Unreadable(e.to_string());
                if seen == self.seen {
                    return ReloadOutcome::Unchanged;
                }
                let err = LimitsFileError {
                    path: self.path.clone(),
                    position: None,
                    message: format!("cannot read: {e}"),
                };
                (seen, Err((err, "unreadable")))
            }
        };
        self.seen = seen;
        match parsed {
            Ok(limits) => {
                let changes = self.current.changes(&limits);
                tracing::info!(
                    name = %self.name,
                    path = %self.path.display(),
                    changes = %if changes.is_empty() { "none".to_owned() } else { changes.join("; ") },
                    "limits file reloaded"
                );
                self.count("applied");
                self.current = limits.clone();
                ReloadOutcome::Applied(limits)
            }
            Err((err, result)) => {
                tracing::warn!(
                    name = %self.name,
                    error = %err,
                    "limits file refused, the limits in force are kept"
                );
                self.count(result);
                ReloadOutcome::Refused(err)
            }
        }
    }

    fn count(&self, result: &'static str) {
        metrics::counter!(RELOADS_TOTAL, NAME_LABEL => self.name.clone(), "result" => result)
            .increment(1);
    }
}

/// A thread that looks at the limits file every [`INTERVAL`](Self::INTERVAL) and passes
/// each new valid content to `apply`; it stops when dropped.
///
/// ```no_run
/// use ratelimit_layer::limits_file::{LimitsWatcher, Reloader};
///
/// let reloader = Reloader::new("limits.toml", "api")?;
/// // Put `reloader.current()` in force, then:
/// let watcher = LimitsWatcher::start(reloader, LimitsWatcher::INTERVAL, |limits| {
///     // Set each limit's handle from `limits`.
///     let _ = limits;
/// });
/// # drop(watcher);
/// # Ok::<(), ratelimit_layer::limits_file::LimitsFileError>(())
/// ```
#[derive(Debug)]
pub struct LimitsWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LimitsWatcher {
    /// How often the file is looked at unless told otherwise: 250 ms, so a change is in
    /// force within a second with room to spare.
    pub const INTERVAL: Duration = Duration::from_millis(250);

    /// Starts looking at `reloader`'s file every `interval`.
    pub fn start(
        mut reloader: Reloader,
        interval: Duration,
        apply: impl Fn(&Limits) + Send + 'static,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("limits-watcher".into())
            .spawn(move || {
                while !stopping.load(Ordering::Acquire) {
                    if let ReloadOutcome::Applied(limits) = reloader.poll() {
                        apply(&limits);
                    }
                    std::thread::park_timeout(interval);
                }
            })
            .ok();
        if thread.is_none() {
            tracing::warn!("cannot start the limits file's watcher thread; no reloads");
        }
        Self { stop, thread }
    }
}

impl Drop for LimitsWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
