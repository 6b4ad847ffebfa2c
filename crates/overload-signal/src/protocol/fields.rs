//! Which of the protocol's request fields a request carries, found in one pass over its
//! header names.

use http::HeaderMap;

/// The request fields the server layers read (the protocol's `content-type`, the attempt
/// counters, the deadlines), as a set: what one pass over a request's header names found.
///
/// NOTE: a set that says a field is absent must be right (a reader skips its look-up); one
/// that says it is present may be wrong (the reader looks it up, and finds nothing).
/// [`ALL`](Self::ALL) is the set of a caller that did not look: every reader looks up every
/// field, as before this type existed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestFields(u8);

impl RequestFields {
    pub(crate) const CONTENT_TYPE: u8 = 1 << 0;
    pub(crate) const X_REQUEST_ATTEMPT: u8 = 1 << 1;
    pub(crate) const X_ENVOY_ATTEMPT_COUNT: u8 = 1 << 2;
    pub(crate) const GRPC_PREVIOUS_RPC_ATTEMPTS: u8 = 1 << 3;
    pub(crate) const X_REQUEST_DEADLINE: u8 = 1 << 4;
    pub(crate) const X_ENVOY_EXPECTED_RQ_TIMEOUT_MS: u8 = 1 << 5;
    pub(crate) const GRPC_TIMEOUT: u8 = 1 << 6;
    pub(crate) const X_REQUEST_CRITICALITY: u8 = 1 << 7;

    /// Every field possibly present: each reader looks each one up.
    pub(crate) const ALL: Self = Self(u8::MAX);

    /// Above this many distinct header names, looking each field up (a hash and a probe
    /// each) costs less than comparing every name: 16, more than a typical API client or
    /// proxy sends (oha, curl, hyper and gRPC clients send 3 to 10), fewer than a browser
    /// may.
    const SCAN_MAX: usize = 16;

    /// The fields of `headers`: one pass over their names (up to [`SCAN_MAX`] names; a
    /// larger map is looked up field by field).
    ///
    /// NOTE: on the hot path of every request, in place of the six look-ups of the layers'
    /// readers, each of which hashes the field's name (up to 30 bytes); most requests carry
    /// none of these fields.
    #[inline]
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        if headers.keys_len() > Self::SCAN_MAX {
            return Self::looked_up(headers);
        }
        let mut bits = 0;
        for name in headers.keys() {
            bits |= Self::bit_of(name.as_str());
        }
        Self(bits)
    }

    /// The bit of the field named `name` (lower case, as `http` keeps every name), 0 for
    /// any other name. The lengths tell the names apart but for two of 12 bytes and two of 21.
    #[inline]
    fn bit_of(name: &str) -> u8 {
        match name.len() {
            12 if name == "content-type" => Self::CONTENT_TYPE,
            12 if name == "grpc-timeout" => Self::GRPC_TIMEOUT,
            17 if name == "x-request-attempt" => Self::X_REQUEST_ATTEMPT,
            18 if name == "x-request-deadline" => Self::X_REQUEST_DEADLINE,
            21 if name == "x-request-criticality" => Self::X_REQUEST_CRITICALITY,
            21 if name == "x-envoy-attempt-count" => Self::X_ENVOY_ATTEMPT_COUNT,
            26 if name == "grpc-previous-rpc-attempts" => Self::GRPC_PREVIOUS_RPC_ATTEMPTS,
            30 if name == "x-envoy-expected-rq-timeout-ms" => Self::X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            _ => 0,
        }
    }

    /// The fields of a large map, one look-up each.
    #[cold]
    fn looked_up(headers: &HeaderMap) -> Self {
        use super::headers as h;
        let fields = [
            (http::header::CONTENT_TYPE, Self::CONTENT_TYPE),
            (h::X_REQUEST_ATTEMPT, Self::X_REQUEST_ATTEMPT),
            (h::X_ENVOY_ATTEMPT_COUNT, Self::X_ENVOY_ATTEMPT_COUNT),
            (
                h::GRPC_PREVIOUS_RPC_ATTEMPTS,
                Self::GRPC_PREVIOUS_RPC_ATTEMPTS,
            ),
            (h::X_REQUEST_DEADLINE, Self::X_REQUEST_DEADLINE),
            (
                h::X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
                Self::X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            ),
            (h::GRPC_TIMEOUT, Self::GRPC_TIMEOUT),
            (h::X_REQUEST_CRITICALITY, Self::X_REQUEST_CRITICALITY),
        ];
        Self(
            fields
                .into_iter()
                .filter(|(name, _)| headers.contains_key(name))
                .fold(0, |bits, (_, bit)| bits | bit),
        )
    }

    /// Whether any of `bits` may be present.
    #[inline]
    pub(crate) const fn may_have(self, bits: u8) -> bool {
        self.0 & bits != 0
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderName, HeaderValue};

    use super::RequestFields;
    use crate::protocol::{
        GRPC_PREVIOUS_RPC_ATTEMPTS, GRPC_TIMEOUT, X_ENVOY_ATTEMPT_COUNT,
        X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, X_REQUEST_ATTEMPT, X_REQUEST_CRITICALITY,
        X_REQUEST_DEADLINE,
    };

    fn every_field() -> [(HeaderName, u8); 8] {
        [
            (http::header::CONTENT_TYPE, RequestFields::CONTENT_TYPE),
            (X_REQUEST_ATTEMPT, RequestFields::X_REQUEST_ATTEMPT),
            (X_ENVOY_ATTEMPT_COUNT, RequestFields::X_ENVOY_ATTEMPT_COUNT),
            (
                GRPC_PREVIOUS_RPC_ATTEMPTS,
                RequestFields::GRPC_PREVIOUS_RPC_ATTEMPTS,
            ),
            (X_REQUEST_DEADLINE, RequestFields::X_REQUEST_DEADLINE),
            (
                X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
                RequestFields::X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            ),
            (GRPC_TIMEOUT, RequestFields::GRPC_TIMEOUT),
            (X_REQUEST_CRITICALITY, RequestFields::X_REQUEST_CRITICALITY),
        ]
    }

    /// The scan and the look-ups agree, field by field, with a few other names around and
    /// with more names than the scan takes.
    #[test]
    fn the_scan_finds_what_the_look_ups_find() {
        for (name, bit) in every_field() {
            for others in [0, 3, RequestFields::SCAN_MAX + 1] {
                let mut headers = HeaderMap::new();
                for i in 0..others {
                    headers.insert(
                        HeaderName::from_bytes(format!("x-other-{i}").as_bytes()).unwrap(),
                        HeaderValue::from_static("1"),
                    );
                }
                headers.insert(http::header::HOST, HeaderValue::from_static("h"));
                assert_eq!(RequestFields::of(&headers).0, 0, "{others} other names");
                headers.append(name.clone(), HeaderValue::from_static("1"));
                headers.append(name.clone(), HeaderValue::from_static("2"));
                let fields = RequestFields::of(&headers);
                assert_eq!(fields.0, bit, "{name} among {others} other names");
                assert_eq!(fields, RequestFields::looked_up(&headers));
            }
        }
        let mut all = HeaderMap::new();
        for (name, _) in every_field() {
            all.insert(name, HeaderValue::from_static("1"));
        }
        assert_eq!(RequestFields::of(&all).0, 0xff);
        assert!(RequestFields::ALL.may_have(RequestFields::GRPC_TIMEOUT));
    }
}
