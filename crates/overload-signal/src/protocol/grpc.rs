//! gRPC's side of the protocol: recognising a gRPC message and reading its status.

use http::header::HeaderMap;

use super::headers::GRPC_STATUS;

/// gRPC status code `INVALID_ARGUMENT` (3): the request itself is wrong, whatever the
/// server's state; a request too heavy ever to pass a rate limit is answered with it.
pub const GRPC_INVALID_ARGUMENT: u16 = 3;

/// gRPC status code `DEADLINE_EXCEEDED` (4): a call's deadline passed before it completed.
pub const GRPC_DEADLINE_EXCEEDED: u16 = 4;

/// gRPC status code `RESOURCE_EXHAUSTED` (8): the protocol's node-local rejection.
pub const GRPC_RESOURCE_EXHAUSTED: u16 = 8;

/// gRPC status code `UNAVAILABLE` (14): used with a negative pushback for the stop signal.
pub const GRPC_UNAVAILABLE: u16 = 14;

/// Whether a message with these headers is gRPC: its `content-type` is `application/grpc`
/// or starts with `application/grpc+` / `application/grpc;` (case-insensitive).
///
/// gRPC-Web (`application/grpc-web...`) is not gRPC here: see [`is_grpc_web`].
pub fn is_grpc(headers: &HeaderMap) -> bool {
    content_type_is(headers, b"application/grpc")
}

/// Whether a message with these headers is gRPC-Web: its `content-type` is
/// `application/grpc-web` or `application/grpc-web-text`, alone or followed by `+` (a
/// message format, `+proto`) or `;` (case-insensitive). gRPC-Web carries the same statuses
/// as gRPC, over HTTP/1.1 too, as browsers and proxies such as Envoy speak it.
pub fn is_grpc_web(headers: &HeaderMap) -> bool {
    content_type_is(headers, b"application/grpc-web")
        || content_type_is(headers, b"application/grpc-web-text")
}

/// Whether `content-type` is `media`, alone or followed by `+...` or `;...`.
fn content_type_is(headers: &HeaderMap, media: &[u8]) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|ct| media_is(ct.as_bytes(), media))
}

/// Whether the `content-type` value `ct` is `media`, alone or followed by `+...` or `;...`
/// (case-insensitive).
pub(super) fn media_is(ct: &[u8], media: &[u8]) -> bool {
    if ct.len() < media.len() || !ct[..media.len()].eq_ignore_ascii_case(media) {
        return false;
    }
    matches!(ct.get(media.len()), None | Some(b'+' | b';'))
}

/// The gRPC status carried in `grpc-status` in these headers, if any and well-formed.
///
/// Only trailers-only responses (the form rejections take) carry it in headers; a status in
/// the trailers of a streamed body is not visible here.
pub fn grpc_status(headers: &HeaderMap) -> Option<u16> {
    let v = headers.get(GRPC_STATUS)?.to_str().ok()?.trim();
    if v.is_empty() || v.len() > 5 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ct(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn grpc_content_types() {
        assert!(is_grpc(&ct("application/grpc")));
        assert!(is_grpc(&ct("application/grpc+proto")));
        assert!(is_grpc(&ct("Application/GRPC+json")));
        assert!(is_grpc(&ct("application/grpc;charset=utf-8")));
        assert!(!is_grpc(&ct("application/grpc-web")));
        assert!(!is_grpc(&ct("application/json")));
        assert!(!is_grpc(&ct("application/grp")));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn grpc_web_content_types() {
        for web in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "Application/GRPC-Web-Text",
            "application/grpc-web-text+proto",
            "application/grpc-web;charset=utf-8",
        ] {
            assert!(is_grpc_web(&ct(web)), "{web}");
            assert!(!is_grpc(&ct(web)), "{web}");
        }
        for other in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc-webx",
            "application/grpc-web-textual",
            "application/json",
        ] {
            assert!(!is_grpc_web(&ct(other)), "{other}");
        }
        assert!(!is_grpc_web(&HeaderMap::new()));
    }

    #[test]
    fn grpc_status_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(grpc_status(&h), None);
        h.insert(GRPC_STATUS, HeaderValue::from_static("8"));
        assert_eq!(grpc_status(&h), Some(8));
        h.insert(GRPC_STATUS, HeaderValue::from_static("x"));
        assert_eq!(grpc_status(&h), None);
        h.insert(GRPC_STATUS, HeaderValue::from_static("999999"));
        assert_eq!(grpc_status(&h), None);
    }
}
