use std::convert::Infallible;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service, ServiceExt};

use super::*;
use crate::Trust;
use crate::protocol::Criticality::{Critical, CriticalPlus, Sheddable, SheddablePlus};
use crate::protocol::X_REQUEST_CRITICALITY;

/// A service that answers with the level it saw: in `call` (before its future runs, as a
/// retry layer right inside reads it), in its future, and in the request's extensions.
#[derive(Clone)]
struct Echo;

type Seen = (
    Option<Criticality>,
    Option<Criticality>,
    Option<Criticality>,
);

impl Service<Request<()>> for Echo {
    type Response = Response<Seen>;
    type Error = Infallible;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Response<Seen>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<()>) -> Self::Future {
        let in_call = current();
        let extension = Some(Criticality::of(request.extensions()));
        Box::pin(async move {
            tokio::task::yield_now().await;
            Ok(Response::new((in_call, current(), extension)))
        })
    }
}

fn request(level: Option<&str>, peer: Option<&str>) -> Request<()> {
    let mut request = Request::new(());
    if let Some(level) = level {
        request
            .headers_mut()
            .insert(X_REQUEST_CRITICALITY, level.parse().unwrap());
    }
    if let Some(peer) = peer {
        request
            .extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
    }
    request
}

async fn level(layer: &CriticalityLayer, request: Request<()>) -> Criticality {
    let (in_call, in_future, extension) = layer
        .layer(Echo)
        .oneshot(request)
        .await
        .unwrap()
        .into_body();
    assert_eq!(in_call, in_future, "call and future run in one level");
    assert_eq!(in_call, extension, "the extension is the level it runs in");
    extension.expect("every request gets a level")
}

const PRIVATE: Option<&str> = Some("10.1.2.3:5000");
const PUBLIC: Option<&str> = Some("203.0.113.9:5000");

#[tokio::test]
async fn a_trusted_caller_gets_the_level_it_claims_and_junk_gets_the_default() {
    let layer = CriticalityLayer::new();
    for claimed in Criticality::ALL {
        assert_eq!(
            level(&layer, request(Some(claimed.as_str()), PRIVATE)).await,
            claimed
        );
    }
    for junk in ["", "urgent", "critical plus", "critical-plus-plus"] {
        assert_eq!(
            level(&layer, request(Some(junk), PRIVATE)).await,
            Critical,
            "{junk:?}"
        );
    }
    assert_eq!(level(&layer, request(None, PRIVATE)).await, Critical);
    let batch = CriticalityLayer::builder()
        .default_level(SheddablePlus)
        .build()
        .unwrap();
    assert_eq!(level(&batch, request(None, PRIVATE)).await, SheddablePlus);
    assert_eq!(
        level(&batch, request(Some("junk"), PRIVATE)).await,
        SheddablePlus
    );
}

#[tokio::test]
async fn an_untrusted_caller_cannot_claim_more_than_the_cap_but_may_claim_less() {
    let layer = CriticalityLayer::new();
    for peer in [PUBLIC, None] {
        assert_eq!(
            level(&layer, request(Some("critical-plus"), peer)).await,
            Critical
        );
        assert_eq!(
            level(&layer, request(Some("sheddable"), peer)).await,
            Sheddable
        );
        assert_eq!(level(&layer, request(None, peer)).await, Critical);
    }
    // A cap of `sheddable` sheds every untrusted caller first, its default level included.
    let strict = CriticalityLayer::builder()
        .untrusted_max(Sheddable)
        .build()
        .unwrap();
    assert_eq!(level(&strict, request(None, PUBLIC)).await, Sheddable);
    assert_eq!(
        level(&strict, request(Some("critical"), PUBLIC)).await,
        Sheddable
    );
    assert_eq!(level(&strict, request(None, PRIVATE)).await, Critical);
    let open = CriticalityLayer::builder()
        .trust(Trust::everyone())
        .build()
        .unwrap();
    assert_eq!(
        level(&open, request(Some("critical-plus"), PUBLIC)).await,
        CriticalPlus
    );
    let closed = CriticalityLayer::builder()
        .trust(Trust::nobody())
        .build()
        .unwrap();
    assert_eq!(
        level(&closed, request(Some("critical-plus"), PRIVATE)).await,
        Critical
    );
}

#[tokio::test]
async fn a_level_the_servers_own_code_set_is_taken_as_it_is() {
    let layer = CriticalityLayer::builder()
        .untrusted_max(Sheddable)
        .build()
        .unwrap();
    let mut from_code = request(Some("sheddable"), PUBLIC);
    from_code.extensions_mut().insert(CriticalPlus);
    assert_eq!(level(&layer, from_code).await, CriticalPlus);
}

#[tokio::test]
async fn the_handler_runs_in_its_requests_level_and_cannot_raise_it() {
    let layer = CriticalityLayer::new();
    let service = layer.layer(tower::service_fn(|_: Request<()>| async {
        let raised = scope(CriticalPlus, async { outgoing(Some(CriticalPlus)) }).await;
        Ok::<_, Infallible>(Response::new((current(), raised)))
    }));
    let seen = service
        .oneshot(request(Some("sheddable-plus"), PRIVATE))
        .await
        .unwrap()
        .into_body();
    assert_eq!(seen, (Some(SheddablePlus), Some(SheddablePlus)));
    assert_eq!(current(), None, "outside the request");
}

#[test]
fn the_level_of_a_request_is_what_the_service_would_set() {
    let layer = CriticalityLayer::new();
    assert_eq!(layer.level_of(&request(Some("SHEDDABLE"), None)), Sheddable);
    assert_eq!(
        layer.level_of(&request(Some("critical-plus"), PRIVATE)),
        CriticalPlus
    );
}
