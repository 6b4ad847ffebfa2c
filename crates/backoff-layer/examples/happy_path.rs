//! The retry layer's happy path, `N` requests in a loop, with the defaults or without the
//! client-side throttle: for counting the instructions each costs, which a loaded machine
//! does not change (criterion's times do):
//!
//! ```text
//! cargo build --release -p backoff-layer --example happy_path
//! for v in no_throttle defaults; do for n in 100000 300000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/happy_path $v $n 2>&1 | grep Collected
//! done; done
//! ```
//!
//! The instructions per request are the difference between the two counts of a variant over
//! the 200 000 requests between them (the fixed costs of the process cancel out).
use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::task::{Context, Poll};

use backoff_layer::RetryLayer;
use bytes::Bytes;
use futures_util::task::noop_waker_ref;
use http::{Request, Response};
use http_body_util::Empty;
use tower::{Layer, Service, ServiceExt};

/// An inner service that answers `200` at once.
#[derive(Clone, Copy)]
struct Answer;
impl<B> Service<Request<B>> for Answer {
    type Response = Response<Empty<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<B>) -> Self::Future {
        ready(Ok(Response::new(Empty::new())))
    }
}

/// Drives a future that completes without waiting.
fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(noop_waker_ref())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the happy path must not wait"),
    }
}

fn main() {
    // A runtime context, as the bench has, for the timers and the throttle's ticker (which
    // never runs here: nothing drives the runtime).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let _guard = rt.enter();
    let mut args = std::env::args().skip(1);
    let usage = "usage: happy_path defaults|no_throttle N";
    let which = args.next().expect(usage);
    let n: u64 = args.next().and_then(|n| n.parse().ok()).expect(usage);
    let layer = match which.as_str() {
        "defaults" => RetryLayer::new(),
        "no_throttle" => RetryLayer::builder()
            .no_throttle()
            .build()
            .expect("a valid layer"),
        _ => panic!("{usage}"),
    };
    let svc = layer.layer(Answer);
    for _ in 0..n {
        let request = Request::get("http://127.0.0.1/api")
            .body(Empty::<Bytes>::new())
            .expect("a valid request");
        let response = now(svc.clone().oneshot(black_box(request)));
        black_box(response.expect("the answer"));
    }
}
