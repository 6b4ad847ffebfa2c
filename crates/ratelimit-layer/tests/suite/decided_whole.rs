//! A limit that reads nothing of the request (one limit for every request, a fixed cost)
//! decides a request without taking it apart: it answers as a limit that reads the request
//! does, admitted and rejected alike, `Local` or `Remote` without a remote decider.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use overload_signal::protocol::{RATELIMIT, RATELIMIT_POLICY};
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::{RateLimitLayer, TokenBucket};
use tower::{Layer, Service, ServiceExt, service_fn};

/// What a client sees of one answer: the status, the `RateLimit-Policy`, `RateLimit` and
/// `Retry-After` fields, and the body.
type Seen = (
    StatusCode,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
);

fn field(response: &Response<String>, name: &http::HeaderName) -> Option<String> {
    let values: Vec<_> = response
        .headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

fn inner(
    calls: &Arc<AtomicUsize>,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone + use<>
{
    let calls = Arc::clone(calls);
    service_fn(move |request: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        // NOTE: the handler sees the request whole: its header and its extension.
        let header = request.headers().get("x-probe").cloned();
        let extension = request.extensions().get::<u32>().copied();
        async move {
            assert_eq!(header.as_ref().map(|v| v.as_bytes()), Some(&b"p"[..]));
            assert_eq!(extension, Some(7));
            Ok::<_, Infallible>(Response::new(request.into_body()))
        }
    })
}

/// Sends 6 requests at once, then 2 more 250 ms later (a bucket of 4 per second, bursts of
/// 3, each request costing 1): what each got back, and how many reached the inner service.
async fn run<S>(service: S, clock: &FakeClock, calls: &Arc<AtomicUsize>) -> (Vec<Seen>, usize)
where
    S: Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
{
    let mut seen = Vec::new();
    for i in 0..8 {
        if i == 6 {
            clock.advance(Duration::from_millis(250));
        }
        let mut request = Request::new(format!("body {i}"));
        request
            .headers_mut()
            .insert("x-probe", "p".parse().unwrap());
        request.extensions_mut().insert(7u32);
        let response = service.clone().oneshot(request).await.unwrap();
        seen.push((
            response.status(),
            field(&response, &RATELIMIT_POLICY),
            field(&response, &RATELIMIT),
            field(&response, &http::header::RETRY_AFTER),
            response.into_body(),
        ));
    }
    (seen, calls.load(Ordering::SeqCst))
}

fn bucket() -> TokenBucket {
    TokenBucket::builder(4).burst(3).build().unwrap()
}

#[tokio::test]
async fn a_fixed_cost_global_limit_answers_as_one_that_reads_the_request() {
    // The reference: the cost read from the request (always 1), so the request is taken
    // apart to decide it.
    let (clock, calls) = (FakeClock::new(), Arc::new(AtomicUsize::new(0)));
    let layer = RateLimitLayer::builder(bucket())
        .clock(clock.clone())
        .admitted_headers(true)
        .cost_by(|_| 1)
        .build()
        .unwrap();
    let (reads, reads_calls) = run(layer.layer(inner(&calls)), &clock, &calls).await;

    let (clock, calls) = (FakeClock::new(), Arc::new(AtomicUsize::new(0)));
    let layer = RateLimitLayer::builder(bucket())
        .clock(clock.clone())
        .admitted_headers(true)
        .build()
        .unwrap();
    let (whole, whole_calls) = run(layer.layer(inner(&calls)), &clock, &calls).await;
    assert_eq!(whole, reads);
    assert_eq!(whole_calls, reads_calls);

    // What the run went through: the burst admitted with its fields, then rejections, then
    // one admission after the refill.
    let statuses: Vec<_> = reads.iter().map(|seen| seen.0.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 200, 429]);
    assert_eq!(reads_calls, 4);
    assert!(
        reads[0].1.is_some() && reads[0].2.is_some(),
        "{:?}",
        reads[0]
    );
    assert!(
        reads[3].3.is_some(),
        "a rejection says when to retry: {:?}",
        reads[3]
    );
    assert_eq!(
        reads[6].4, "body 6",
        "the admitted request reached the handler whole"
    );

    // Without admitted fields, as by default.
    let (clock, calls) = (FakeClock::new(), Arc::new(AtomicUsize::new(0)));
    let layer = RateLimitLayer::builder(bucket())
        .clock(clock.clone())
        .cost_by(|_| 1)
        .build()
        .unwrap();
    let (plain_reads, _) = run(layer.layer(inner(&calls)), &clock, &calls).await;
    let (clock, calls) = (FakeClock::new(), Arc::new(AtomicUsize::new(0)));
    let layer = RateLimitLayer::builder(bucket())
        .clock(clock.clone())
        .build()
        .unwrap();
    let (plain_whole, _) = run(layer.layer(inner(&calls)), &clock, &calls).await;
    assert_eq!(plain_whole, plain_reads);
    assert_eq!(
        plain_whole[0].2, None,
        "no field on an admitted answer by default"
    );
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_local_limit_converted_to_remote_answers_as_the_local_one() {
    use ratelimit_layer::Remote;

    let (clock, calls) = (FakeClock::new(), Arc::new(AtomicUsize::new(0)));
    let layer = RateLimitLayer::builder(bucket())
        .clock(clock.clone())
        .admitted_headers(true)
        .build()
        .unwrap();
    let (local, local_calls) = run(layer.layer(inner(&calls)), &clock, &calls).await;

    let (clock, calls) = (FakeClock::new(), Arc::new(AtomicUsize::new(0)));
    let layer: RateLimitLayer<Remote> = RateLimitLayer::builder(bucket())
        .clock(clock.clone())
        .admitted_headers(true)
        .build()
        .unwrap()
        .into();
    let (remote, remote_calls) = run(layer.layer(inner(&calls)), &clock, &calls).await;
    assert_eq!(remote, local);
    assert_eq!(remote_calls, local_calls);
    let statuses: Vec<_> = remote.iter().map(|seen| seen.0.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 200, 429]);

    // With a cost read from the request, the `Remote` limit takes the request apart.
    let (clock, calls) = (FakeClock::new(), Arc::new(AtomicUsize::new(0)));
    let layer: RateLimitLayer<Remote> = RateLimitLayer::builder(bucket())
        .clock(clock.clone())
        .admitted_headers(true)
        .cost_by(|_| 1)
        .build()
        .unwrap()
        .into();
    let (remote_reads, _) = run(layer.layer(inner(&calls)), &clock, &calls).await;
    assert_eq!(remote_reads, local);
}
