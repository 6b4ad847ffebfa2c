//! Connection tracking: the open connections, their requests in progress, the counts, and
//! the signal the accept loop and the shutdown wait on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use overload_core::clock::{Clock, TokioClock};
use tokio::sync::Notify;

use super::metric_names;

/// Counts of the connections a [`Server`](super::Server) has open and has closed on its
/// own. Clones share the counts.
#[derive(Clone, Debug, Default)]
pub struct ConnectionStats {
    inner: Arc<StatsInner>,
}

#[derive(Debug, Default)]
struct StatsInner {
    open: AtomicUsize,
    header_timeouts: AtomicU64,
    evicted: AtomicU64,
}

impl ConnectionStats {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.inner.open.load(Ordering::Relaxed)
    }

    /// Connections closed because no complete request head arrived in time, since start.
    pub fn header_timeouts(&self) -> u64 {
        self.inner.header_timeouts.load(Ordering::Relaxed)
    }

    /// Connections closed to make room under the connection cap, since start.
    pub fn evicted(&self) -> u64 {
        self.inner.evicted.load(Ordering::Relaxed)
    }
}

/// The open connections, for the cap and for shutdown.
#[derive(Debug, Default)]
pub(super) struct Registry {
    conns: Mutex<HashMap<u64, Arc<Track>>>,
    next_id: AtomicU64,
    /// Signalled when a connection closes or has no request in progress any more.
    changed: Arc<Changes>,
    stats: ConnectionStats,
}

/// A signal for the accept loop and the shutdown, cheap for the requests that raise it.
#[derive(Debug, Default)]
struct Changes {
    notify: Notify,
    /// Tasks waiting for a change. Requests end far more often than anyone waits (only at
    /// the connection cap and at shutdown), so they skip `Notify`'s lock when none does.
    waiting: AtomicUsize,
}

impl Changes {
    /// Wakes the waiting tasks, if any. `SeqCst`, with the waiter's side: either the waiter
    /// sees the change, or this sees the waiter.
    fn raise(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Returns once `done` holds, checking it again after every change.
    async fn until(&self, mut done: impl FnMut() -> bool) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        loop {
            let changed = self.notify.notified();
            tokio::pin!(changed);
            // NOTE: registered before the check, so a change between the check and the
            // wait is not missed.
            changed.as_mut().enable();
            if done() {
                return;
            }
            changed.await;
        }
    }
}

/// Counts a task in [`Changes::waiting`] while it lives (also when its future is dropped).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Registry {
    pub(super) fn register(self: &Arc<Self>, clock: TokioClock) -> Arc<Track> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let track = Arc::new(Track {
            id,
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(clock.now()),
            clock,
            evict: Notify::new(),
            changes: Arc::clone(&self.changed),
        });
        let mut conns = self.lock();
        conns.insert(id, Arc::clone(&track));
        self.stats.inner.open.store(conns.len(), Ordering::Relaxed);
        track
    }

    pub(super) fn remove(&self, id: u64) {
        let mut conns = self.lock();
        conns.remove(&id);
        self.stats.inner.open.store(conns.len(), Ordering::Relaxed);
        drop(conns);
        self.changed.raise();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Track>>> {
        // NOTE: no code path panics while holding the lock, and the map stays consistent
        // at every step anyway.
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns once fewer than `max` connections are open, closing the connection idle the
    /// longest when there is one to make room.
    pub(super) async fn make_room(&self, max: usize) {
        self.changed
            .until(|| self.lock().len() < max || self.evict_one())
            .await;
    }

    /// Closes the connection without a request in progress that has been idle longest;
    /// `false` if every open connection has a request in progress.
    fn evict_one(&self) -> bool {
        let mut conns = self.lock();
        let victim = conns
            .values()
            .filter(|t| t.in_flight.load(Ordering::SeqCst) == 0)
            .min_by_key(|t| t.idle_since.load(Ordering::Acquire))
            .map(|t| t.id);
        let Some(id) = victim else {
            return false;
        };
        // NOTE: removed now, not when its task ends, so the next accept does not evict
        // another one for the same room.
        if let Some(track) = conns.remove(&id) {
            self.stats.inner.open.store(conns.len(), Ordering::Relaxed);
            // `notify_one` stores a permit if the task is not waiting right now.
            track.evict.notify_one();
            self.stats.inner.evicted.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(metric_names::CONNECTIONS_CLOSED, "reason" => "evicted").increment(1);
        }
        true
    }

    /// Counts a connection closed because no complete request head arrived in time.
    pub(super) fn header_timeout(&self) {
        self.stats
            .inner
            .header_timeouts
            .fetch_add(1, Ordering::Relaxed);
        metrics::counter!(metric_names::CONNECTIONS_CLOSED, "reason" => "header_timeout")
            .increment(1);
    }

    /// The connection counts.
    pub(super) fn stats(&self) -> &ConnectionStats {
        &self.stats
    }

    pub(super) async fn closed_all(&self) {
        self.changed.until(|| self.lock().is_empty()).await;
    }
}

/// One connection's state, shared between its task, its requests and the registry.
#[derive(Debug)]
pub(super) struct Track {
    pub(super) id: u64,
    /// Requests in progress: from the call hyper makes until their response body is done.
    in_flight: AtomicUsize,
    /// When the connection last had no request in progress (clock nanoseconds).
    idle_since: AtomicU64,
    clock: TokioClock,
    pub(super) evict: Notify,
    changes: Arc<Changes>,
}

impl Track {
    pub(super) fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy {
            track: Arc::clone(self),
        }
    }

    /// How long the connection has had no request in progress; `None` while it has one.
    pub(super) fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = self.idle_since.load(Ordering::Acquire);
        Some(Duration::from_nanos(self.clock.now().saturating_sub(since)))
    }
}

/// A request in progress on a connection; ends when dropped.
#[derive(Debug)]
pub(super) struct Busy {
    track: Arc<Track>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let t = &self.track;
        // NOTE: the time is stored before the count drops, so a reader that sees the
        // connection idle also sees when it became idle.
        t.idle_since.store(t.clock.now(), Ordering::Release);
        if t.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            t.changes.raise();
        }
    }
}
