//! Request bodies that can be sent again, byte for byte.
//!
//! The inner service of [`Retry`](crate::Retry) receives a [`ReplayBody<B>`]. On the first
//! attempt it streams the caller's body as it arrives (nothing waits for the whole body, so
//! streaming and bidirectional calls keep working) and keeps a copy of each data frame, up to
//! a limit (64 KiB by default). A retry gets a new `ReplayBody` that first replays the copied
//! frames, in order, then goes on reading the caller's body where the previous attempt
//! stopped, so every attempt sends exactly the original bytes: never truncated, duplicated or
//! reordered, even when an attempt failed before reading the whole body.
//!
//! Once more than the limit has been read, the copy is dropped and the body can no longer be
//! replayed: the attempt in flight goes on streaming, and the retry layer gives up instead of
//! retrying (see [`GiveUpReason::BodyNotReplayable`](crate::GiveUpReason::BodyNotReplayable)).
//! A body whose size hint already exceeds the limit, and the body of a request that may not be
//! retried at all, are streamed through without any copy.
//!
//! If an earlier attempt is still reading the caller's body when a retry has replayed every
//! copied frame (a connection may go on sending a request whose response already came back),
//! the retry waits for it to read on or to release the body, and continues from there.
//!
//! Trailers are replayed too. Data frames are turned into
//! [`Bytes`](https://docs.rs/bytes/1/bytes/struct.Bytes.html) (without a copy when they
//! already are `Bytes`).

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker, ready};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::BoxError;

pin_project! {
    /// The request body the retry layer gives its inner service; see the [module docs](self).
    ///
    /// It implements [`http_body::Body`](https://docs.rs/http-body/1/http_body/trait.Body.html)
    /// with `Data = Bytes` and `Error = BoxError`, so it fits hyper, hyper-util's legacy
    /// `Client` and tonic's transport. It is `Unpin` when `B` is (hyper-util's `Client`
    /// requires it).
    ///
    /// The retry layer makes every `ReplayBody`; there is no public constructor.
    pub struct ReplayBody<B> {
        #[pin]
        kind: BodyKind<B>,
    }
}

pin_project! {
    #[project = BodyKindProj]
    enum BodyKind<B> {
        // The body had no frames at all: nothing to stream or to replay.
        Empty,
        // Streamed once, never copied.
        Streamed { #[pin] body: B },
        // Copied as it streams, for replay.
        Replay { replay: Replay<B> },
    }
}

/// One attempt's view of a replayable body.
struct Replay<B> {
    shared: Arc<Mutex<ReplayBuffer<B>>>,
    /// The caller's body, while this attempt is the one reading it.
    body: Option<Pin<Box<B>>>,
    /// Index of the next copied frame this attempt must replay.
    next: usize,
    /// Whether this attempt has yielded the trailers (or the end, when there are none).
    done: bool,
    /// Data bytes this attempt has yielded, for the size hint.
    yielded: u64,
}

/// The replay buffer every attempt of one request shares: the copy of the body read so far,
/// and the caller's body itself while no attempt is reading it.
pub(crate) struct ReplayBuffer<B> {
    /// The caller's body, when no attempt is reading it.
    rest: Option<Pin<Box<B>>>,
    /// Every data frame read from the caller's body so far, in order, unless `overflowed`.
    frames: Vec<Bytes>,
    /// Sum of the lengths of `frames`.
    buffered: usize,
    limit: usize,
    /// More than `limit` bytes were read: `frames` was dropped, no replay is possible.
    overflowed: bool,
    /// The caller's body returned an error: no replay is possible.
    failed: bool,
    /// The caller's body has ended (after these trailers, if any).
    ended: bool,
    trailers: Option<HeaderMap>,
    /// The caller's body's size hint before anything was read.
    initial_hint: SizeHint,
    /// An attempt that caught up with the copy while another attempt holds the caller's
    /// body; woken whenever the state changes.
    // NOTE: one slot is enough: the retry layer has at most one new attempt at a time, and
    // only the attempt holding the caller's body can be behind it.
    waiter: Option<Waker>,
}

impl<B> ReplayBuffer<B> {
    fn wake_waiter(&mut self) {
        if let Some(waker) = self.waiter.take() {
            waker.wake();
        }
    }
}

/// A [`ReplayBody`] could not produce the rest of the body: while it was waiting for an
/// earlier attempt to release the caller's body, that attempt read past the replay limit,
/// or the caller's body failed.
///
/// The retry layer checks that a body is replayable before it retries, so the inner service
/// sees this error (as the body's error) only when an earlier attempt, still alive (for
/// example a connection still sending a request whose response has already come back), goes
/// on reading the body after the retry started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayError {
    _priv: (),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request body can no longer be replayed")
    }
}

impl std::error::Error for ReplayError {}

/// The retry layer's handle on a request's body, from which it makes one body per attempt.
pub(crate) enum BodySource<B> {
    /// No frames: every attempt gets an empty body.
    Empty,
    /// Streamed without a copy: no attempt after the first.
    Streamed,
    /// Copied while streaming.
    Shared(Arc<Mutex<ReplayBuffer<B>>>),
}

fn lock<B>(m: &Mutex<ReplayBuffer<B>>) -> MutexGuard<'_, ReplayBuffer<B>> {
    // NOTE: no code panics while holding the lock except a panicking inner body, after which
    // the state is still consistent (each update is a single assignment or push).
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<B: Body> ReplayBody<B> {
    /// A body streamed once, never copied.
    pub(crate) fn streamed(body: B) -> Self {
        Self {
            kind: BodyKind::Streamed { body },
        }
    }

    /// The first attempt's body, and the source of the retries' bodies.
    pub(crate) fn first_of(body: B, limit: usize) -> (Self, BodySource<B>) {
        if body.is_end_stream() {
            // NOTE: `is_end_stream` promises that polling would yield nothing, not even
            // trailers, so dropping the body loses nothing.
            return (
                Self {
                    kind: BodyKind::Empty,
                },
                BodySource::Empty,
            );
        }
        let hint = body.size_hint();
        if usize::try_from(hint.lower()).map_or(true, |lower| lower > limit) {
            return (Self::streamed(body), BodySource::Streamed);
        }
        let shared = Arc::new(Mutex::new(ReplayBuffer {
            rest: None,
            frames: Vec::new(),
            buffered: 0,
            limit,
            overflowed: false,
            failed: false,
            ended: false,
            trailers: None,
            initial_hint: hint,
            waiter: None,
        }));
        let first = Replay {
            shared: Arc::clone(&shared),
            body: Some(Box::pin(body)),
            next: 0,
            done: false,
            yielded: 0,
        };
        (
            Self {
                kind: BodyKind::Replay { replay: first },
            },
            BodySource::Shared(shared),
        )
    }
}

impl<B> BodySource<B> {
    /// A body for the next attempt, or `None` if the body cannot be sent again.
    pub(crate) fn replay(&self) -> Option<ReplayBody<B>> {
        match self {
            BodySource::Empty => Some(ReplayBody {
                kind: BodyKind::Empty,
            }),
            BodySource::Streamed => None,
            BodySource::Shared(shared) => {
                let s = lock(shared);
                if s.overflowed || s.failed {
                    return None;
                }
                drop(s);
                Some(ReplayBody {
                    kind: BodyKind::Replay {
                        replay: Replay {
                            shared: Arc::clone(shared),
                            body: None,
                            next: 0,
                            done: false,
                            yielded: 0,
                        },
                    },
                })
            }
        }
    }
}

impl<B> Drop for Replay<B> {
    fn drop(&mut self) {
        // Hand the caller's body back so that the next attempt can go on reading it.
        if let Some(body) = self.body.take() {
            let mut s = lock(&self.shared);
            s.rest = Some(body);
            s.wake_waiter();
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            BodyKindProj::Empty => Poll::Ready(None),
            BodyKindProj::Streamed { body } => match ready!(body.poll_frame(cx)) {
                Some(Ok(frame)) => Poll::Ready(Some(Ok(frame.map_data(to_bytes)))),
                Some(Err(e)) => Poll::Ready(Some(Err(e.into()))),
                None => Poll::Ready(None),
            },
            BodyKindProj::Replay { replay } => replay.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Empty => true,
            BodyKind::Streamed { body } => body.is_end_stream(),
            BodyKind::Replay { replay } => {
                replay.done || {
                    let s = lock(&replay.shared);
                    s.ended
                        && s.trailers.is_none()
                        && !s.overflowed
                        && replay.next == s.frames.len()
                }
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Empty => SizeHint::with_exact(0),
            BodyKind::Streamed { body } => body.size_hint(),
            BodyKind::Replay { replay } => {
                // Every attempt sends the whole body, so the hint is the original hint less
                // what this attempt has already sent.
                let initial = lock(&replay.shared).initial_hint;
                let mut hint = SizeHint::new();
                hint.set_lower(initial.lower().saturating_sub(replay.yielded));
                if let Some(upper) = initial.upper() {
                    hint.set_upper(upper.saturating_sub(replay.yielded));
                }
                hint
            }
        }
    }
}

impl<B> Replay<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let mut s = lock(&self.shared);
        if self.body.is_none() {
            // Replay what earlier attempts copied.
            if s.overflowed || s.failed {
                return Poll::Ready(Some(Err(ReplayError::default().into())));
            }
            if let Some(frame) = s.frames.get(self.next) {
                let frame = frame.clone();
                self.next += 1;
                self.yielded += frame.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(frame))));
            }
            if s.ended {
                self.done = true;
                return Poll::Ready(s.trailers.clone().map(|t| Ok(Frame::trailers(t))));
            }
            // Caught up: go on reading the caller's body.
            match s.rest.take() {
                Some(body) => self.body = Some(body),
                None => {
                    // NOTE: an earlier attempt still holds it (its connection may still be
                    // sending it). Wait until it hands the body back, reads more, or ends.
                    s.waiter = Some(cx.waker().clone());
                    return Poll::Pending;
                }
            }
        }
        drop(s);

        let Some(body) = self.body.as_mut() else {
            unreachable!("the caller's body was taken just above");
        };
        let polled = ready!(body.as_mut().poll_frame(cx));
        let mut s = lock(&self.shared);
        s.wake_waiter();
        match polled {
            None => {
                s.ended = true;
                self.done = true;
                Poll::Ready(None)
            }
            Some(Err(e)) => {
                s.failed = true;
                s.frames = Vec::new();
                Poll::Ready(Some(Err(e.into())))
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    let data = to_bytes(data);
                    if !s.overflowed {
                        if s.buffered.saturating_add(data.len()) > s.limit {
                            // NOTE: once over the limit the copy is useless; free it now.
                            s.overflowed = true;
                            s.frames = Vec::new();
                        } else {
                            s.buffered += data.len();
                            s.frames.push(data.clone());
                            self.next = s.frames.len();
                        }
                    }
                    self.yielded += data.len() as u64;
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Err(frame) => {
                    // Trailers end the body.
                    s.ended = true;
                    self.done = true;
                    match frame.into_trailers() {
                        Ok(trailers) => {
                            s.trailers = Some(trailers.clone());
                            Poll::Ready(Some(Ok(Frame::trailers(trailers))))
                        }
                        Err(_) => Poll::Ready(None),
                    }
                }
            },
        }
    }
}

fn to_bytes<D: Buf>(mut data: D) -> Bytes {
    data.copy_to_bytes(data.remaining())
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            BodyKind::Empty => "empty",
            BodyKind::Streamed { .. } => "streamed",
            BodyKind::Replay { .. } => "replayable",
        };
        f.debug_struct("ReplayBody").field("kind", &kind).finish()
    }
}

impl<B> fmt::Debug for BodySource<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BodySource::Empty => "BodySource::Empty",
            BodySource::Streamed => "BodySource::Streamed",
            BodySource::Shared(_) => "BodySource::Shared",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::convert::Infallible;

    type Chunks = StreamBody<
        futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>,
    >;

    fn chunks(parts: &[&'static [u8]], trailers: Option<HeaderMap>) -> Chunks {
        let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p))))
            .collect();
        if let Some(t) = trailers {
            frames.push(Ok(Frame::trailers(t)));
        }
        StreamBody::new(futures_util::stream::iter(frames))
    }

    async fn collect<B>(body: ReplayBody<B>) -> (Vec<Bytes>, Option<HeaderMap>)
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        let mut body = std::pin::pin!(body);
        let mut data = Vec::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap();
            match frame.into_data() {
                Ok(d) => data.push(d),
                Err(f) => trailers = Some(f.into_trailers().unwrap()),
            }
        }
        (data, trailers)
    }

    #[tokio::test]
    async fn replays_frames_and_trailers_exactly() {
        let mut t = HeaderMap::new();
        t.insert("x-sum", "42".parse().unwrap());
        let (first, source) = ReplayBody::first_of(chunks(&[b"ab", b"", b"cde"], Some(t)), 100);
        let (a, ta) = collect(first).await;
        let (b, tb) = collect(source.replay().unwrap()).await;
        let (c, tc) = collect(source.replay().unwrap()).await;
        assert_eq!(a, [&b"ab"[..], b"", b"cde"]);
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(ta.as_ref().unwrap()["x-sum"], "42");
        assert_eq!(ta, tb);
        assert_eq!(ta, tc);
    }

    #[tokio::test]
    async fn a_retry_continues_where_an_unfinished_attempt_stopped() {
        let (mut first, source) = ReplayBody::first_of(chunks(&[b"1", b"22", b"333"], None), 100);
        // The first attempt reads one frame, then fails and is dropped.
        let f = first.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "1");
        drop(first);
        let (b, _) = collect(source.replay().unwrap()).await;
        assert_eq!(b, [&b"1"[..], b"22", b"333"]);
        let (c, _) = collect(source.replay().unwrap()).await;
        assert_eq!(b, c);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_streamed_once_whole() {
        let (first, source) = ReplayBody::first_of(chunks(&[b"aaaa", b"bbbb", b"cc"], None), 8);
        let (a, _) = collect(first).await;
        assert_eq!(a.concat(), b"aaaabbbbcc");
        assert!(source.replay().is_none());
    }

    #[tokio::test]
    async fn exactly_the_limit_is_replayable() {
        let (first, source) = ReplayBody::first_of(chunks(&[b"aaaa", b"bbbb"], None), 8);
        let (a, _) = collect(first).await;
        let (b, _) = collect(source.replay().unwrap()).await;
        assert_eq!(a, b);
    }

    #[test]
    fn a_size_hint_over_the_limit_is_never_copied() {
        let (body, source) = ReplayBody::first_of(Full::new(Bytes::from(vec![0u8; 9])), 8);
        assert!(matches!(body.kind, BodyKind::Streamed { .. }));
        assert!(source.replay().is_none());
        assert_eq!(body.size_hint().exact(), Some(9));
    }

    #[tokio::test]
    async fn empty_bodies_are_free_and_always_replayable() {
        let (body, source) = ReplayBody::first_of(http_body_util::Empty::<Bytes>::new(), 8);
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
        let again = source.replay().unwrap();
        assert!(again.is_end_stream());
        assert!(collect(again).await.0.is_empty());
    }

    #[tokio::test]
    async fn size_hint_is_exact_for_full_bodies_on_every_attempt() {
        let (first, source) = ReplayBody::first_of(Full::new(Bytes::from_static(b"hello")), 64);
        assert_eq!(first.size_hint().exact(), Some(5));
        assert!(!first.is_end_stream());
        let (a, _) = collect(first).await;
        let replay = source.replay().unwrap();
        assert_eq!(replay.size_hint().exact(), Some(5));
        let (b, _) = collect(replay).await;
        assert_eq!(a, b);
    }

    #[tokio::test]
    async fn a_retry_waits_for_an_earlier_attempt_to_release_the_body() {
        use futures_util::FutureExt;

        let (mut first, source) = ReplayBody::first_of(chunks(&[b"x", b"y"], None), 100);
        let f = first.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "x"); // the first attempt holds the caller's body
        let mut second = source.replay().unwrap();
        let f = second.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "x");
        // Caught up; the rest is still with the first attempt: wait, do not fail.
        assert!(second.frame().now_or_never().is_none());
        drop(first);
        let f = second.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "y");
        assert!(second.frame().await.is_none());
    }

    #[tokio::test]
    async fn a_waiting_retry_is_woken_when_the_earlier_attempt_reads_on() {
        let (mut first, source) = ReplayBody::first_of(chunks(&[b"x", b"y"], None), 100);
        let _ = first.frame().await;
        let second = source.replay().unwrap();
        let reader = tokio::spawn(collect(second));
        tokio::task::yield_now().await;
        // The first attempt reads on to the end and is dropped; the retry sees everything.
        let (rest, _) = collect(first).await;
        assert_eq!(rest, [&b"y"[..]]);
        let (all, _) = reader.await.unwrap();
        assert_eq!(all, [&b"x"[..], b"y"]);
    }

    #[tokio::test]
    async fn a_failed_body_is_not_replayable() {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Err(std::io::Error::other("upload broke")),
        ];
        let body = StreamBody::new(futures_util::stream::iter(frames));
        let (first, source) = ReplayBody::first_of(body, 100);
        let mut first = std::pin::pin!(first);
        assert!(first.frame().await.unwrap().is_ok());
        assert!(first.frame().await.unwrap().is_err());
        assert!(source.replay().is_none());
    }

    proptest::proptest! {
        /// Whatever the chunking, the limit and where earlier attempts stopped reading, every
        /// attempt that reads to the end sends exactly the original bytes, and a retry is
        /// possible exactly when everything read so far fits in the limit.
        #[test]
        fn every_attempt_sends_exactly_the_original(
            parts in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..40), 0..12),
            limit in 0usize..300,
            stops in proptest::collection::vec(0usize..14, 0..4),
        ) {
            use futures_util::FutureExt;

            let original: Vec<u8> = parts.concat();
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = parts
                .iter()
                .map(|p| Ok(Frame::data(Bytes::from(p.clone()))))
                .collect();
            let body = StreamBody::new(futures_util::stream::iter(frames));
            let (mut attempt, source) = ReplayBody::first_of(body, limit);
            let mut read = 0usize; // bytes read from the caller's body so far
            // Attempts that stop early, after `stop` frames.
            for stop in stops {
                let mut got = Vec::new();
                for _ in 0..stop {
                    match attempt.frame().now_or_never().expect("always ready") {
                        Some(Ok(f)) => got.extend_from_slice(&f.into_data().unwrap()),
                        Some(Err(e)) => panic!("{e}"),
                        None => break,
                    }
                }
                proptest::prop_assert_eq!(&got[..], &original[..got.len()]);
                read = read.max(got.len());
                drop(attempt);
                match source.replay() {
                    Some(next) => {
                        proptest::prop_assert!(read <= limit);
                        attempt = next;
                    }
                    None => {
                        proptest::prop_assert!(read > limit);
                        return Ok(());
                    }
                }
            }
            let (all, _) = collect(attempt).now_or_never().expect("always ready");
            proptest::prop_assert_eq!(&all.concat(), &original);
            proptest::prop_assert_eq!(source.replay().is_some(), original.len() <= limit);
        }
    }
}
