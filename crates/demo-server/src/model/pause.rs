//! A switch that freezes a model the way `SIGSTOP` freezes a server process.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::watch;
use tokio::time::{Duration, Instant, sleep};

/// The backlog bound a [`PauseSwitch::default`] uses: 4096 requests.
///
/// It is the `demo-server` binary's default listen queue (`--backlog`, Go's: the Linux
/// maximum), so a paused in-process model refuses new requests at about the same point as
/// the real process stopped with `SIGSTOP` (the kernel counts connections, this counts
/// requests; the demo's clients send one request per connection at a time).
pub const DEFAULT_BACKLOG: usize = 4096;

/// A cloneable pause/resume control for a [`Model`](super::Model), behaving like `SIGSTOP` and
/// `SIGCONT` sent to the server process.
///
/// While paused:
///
/// - requests already inside the model make no progress: their remaining service time is
///   frozen and resumes where it stopped (an `mmc` request in service keeps its worker; one in
///   the queue stays in the queue);
/// - a new request waits in a backlog, like a connection in the kernel's listen queue that the
///   stopped process does not accept. The backlog is bounded: a request arriving when it is
///   full fails at once with [`Refused`], like a refused connection;
/// - on [`resume`](Self::resume) the whole backlog enters the model at once, as a resumed
///   server accepts its listen queue.
///
/// A backlogged request whose future is dropped (its client gave up) leaves the backlog; this
/// mirrors hyper, which drops a handler whose connection closed right after it was accepted.
///
/// All clones control the same switch. It is not paused when created.
///
/// # Example
///
/// ```
/// use demo_server::model::PauseSwitch;
///
/// let switch = PauseSwitch::new(100);
/// let handle = switch.clone();
/// handle.pause();
/// assert!(switch.is_paused());
/// switch.resume();
/// assert!(!handle.is_paused());
/// ```
#[derive(Clone)]
pub struct PauseSwitch {
    inner: Arc<Inner>,
}

struct Inner {
    paused: watch::Sender<bool>,
    backlog: AtomicUsize,
    backlog_limit: usize,
}

impl PauseSwitch {
    /// A running (not paused) switch whose backlog holds at most `backlog_limit` requests.
    ///
    /// A limit of zero refuses every request that arrives while paused.
    pub fn new(backlog_limit: usize) -> Self {
        let (paused, _) = watch::channel(false);
        Self {
            inner: Arc::new(Inner {
                paused,
                backlog: AtomicUsize::new(0),
                backlog_limit,
            }),
        }
    }

    /// Freezes the model (like `SIGSTOP`). Pausing a paused switch does nothing.
    pub fn pause(&self) {
        self.inner.paused.send_replace(true);
    }

    /// Unfreezes the model and lets the backlog in (like `SIGCONT`). Resuming a running switch
    /// does nothing.
    pub fn resume(&self) {
        self.inner.paused.send_replace(false);
    }

    /// Whether the switch is paused.
    pub fn is_paused(&self) -> bool {
        *self.inner.paused.borrow()
    }

    /// How many requests wait in the backlog now.
    pub fn backlog(&self) -> usize {
        self.inner.backlog.load(Ordering::Relaxed)
    }

    /// The most requests the backlog holds; see [`PauseSwitch::new`].
    pub fn backlog_limit(&self) -> usize {
        self.inner.backlog_limit
    }

    pub(crate) fn watcher(&self) -> PauseWatcher {
        PauseWatcher {
            rx: self.inner.paused.subscribe(),
        }
    }

    /// Waits while the switch is paused, holding a backlog slot; refuses when the backlog is
    /// full. Returns at once when running.
    pub(crate) async fn admit(&self, watcher: &mut PauseWatcher) -> Result<(), Refused> {
        if !self.is_paused() {
            return Ok(());
        }
        let _slot = BacklogSlot::take(&self.inner)?;
        watcher.wait_running().await;
        Ok(())
    }
}

impl Default for PauseSwitch {
    /// A running switch with a backlog of [`DEFAULT_BACKLOG`] requests.
    fn default() -> Self {
        Self::new(DEFAULT_BACKLOG)
    }
}

impl fmt::Debug for PauseSwitch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PauseSwitch")
            .field("paused", &self.is_paused())
            .field("backlog", &self.backlog())
            .field("backlog_limit", &self.inner.backlog_limit)
            .finish()
    }
}

/// A place in the backlog, given back on drop (also when the waiting request is cancelled).
struct BacklogSlot<'a> {
    inner: &'a Inner,
}

impl<'a> BacklogSlot<'a> {
    fn take(inner: &'a Inner) -> Result<Self, Refused> {
        // NOTE: the increment reserves the slot before the check, so two racing requests
        // cannot both take the last one.
        let before = inner.backlog.fetch_add(1, Ordering::AcqRel);
        if before >= inner.backlog_limit {
            inner.backlog.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused { _priv: () });
        }
        Ok(Self { inner })
    }
}

impl Drop for BacklogSlot<'_> {
    fn drop(&mut self) {
        self.inner.backlog.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One request's view of the switch.
pub(crate) struct PauseWatcher {
    rx: watch::Receiver<bool>,
}

impl PauseWatcher {
    /// Returns once the switch is running (at once if it is).
    pub(crate) async fn wait_running(&mut self) {
        // NOTE: an error means every sender is gone; the switch can then never pause again.
        let _ = self.rx.wait_for(|paused| !*paused).await;
    }

    /// Returns `true` once the switch is paused, `false` if it never can be (no sender).
    async fn until_paused(rx: &mut watch::Receiver<bool>) -> bool {
        // NOTE: the `Ref` the wait returns holds a lock; drop it here, before any await.
        rx.wait_for(|paused| *paused).await.is_ok()
    }

    /// Does `amount` of work, in virtual or real time, not counting time spent paused.
    pub(crate) async fn work(&mut self, amount: Duration) {
        let mut remaining = amount;
        while !remaining.is_zero() {
            self.wait_running().await;
            let started = Instant::now();
            let interrupted = {
                let paused = Self::until_paused(&mut self.rx);
                tokio::select! {
                    biased;
                    () = sleep(remaining) => false,
                    sent = paused => sent,
                }
            };
            if !interrupted {
                return;
            }
            remaining = remaining.saturating_sub(started.elapsed());
        }
    }

    /// Does at most `amount` of work; returns how much was done before a pause interrupted
    /// it (all of it if none did). Returns after the pause starts, not after it ends.
    pub(crate) async fn work_until_paused(&mut self, amount: Duration) -> Duration {
        self.wait_running().await;
        let started = Instant::now();
        let paused = Self::until_paused(&mut self.rx);
        tokio::select! {
            biased;
            () = sleep(amount) => amount,
            sent = paused => {
                if sent {
                    started.elapsed().min(amount)
                } else {
                    // No sender left: nothing can pause us any more.
                    sleep(amount.saturating_sub(started.elapsed())).await;
                    amount
                }
            }
        }
    }
}

/// A request refused by a paused model whose backlog was full, like a refused connection.
///
/// Only a paused [`Model`](super::Model) refuses; a running one never does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    _priv: (),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request refused: the server is paused and its backlog is full")
    }
}

impl std::error::Error for Refused {}
