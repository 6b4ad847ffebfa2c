//! gRPC wire details the retry layer needs beyond the shared protocol: reading
//! `grpc-message`. (`grpc-timeout` is the shared protocol's, in `overload_signal::protocol`.)

use http::HeaderValue;

/// Decodes a `grpc-message` (percent-encoded UTF-8); invalid sequences are kept as they are
/// and invalid UTF-8 is replaced, so a hostile server cannot make it fail.
pub(crate) fn decode_message(value: &HeaderValue) -> String {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = (bytes[i] == b'%')
            .then(|| Some((hex(*bytes.get(i + 1)?)? << 4) | hex(*bytes.get(i + 2)?)?))
            .flatten();
        match decoded {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_decoded_leniently() {
        let d = |v: &'static str| decode_message(&HeaderValue::from_static(v));
        assert_eq!(
            d("system overloaded, stop retrying"),
            "system overloaded, stop retrying"
        );
        assert_eq!(d("50%25 off%0A"), "50% off\n");
        assert_eq!(d("%E2%9C%93"), "\u{2713}");
        assert_eq!(d("100%"), "100%");
        assert_eq!(d("%zz%4"), "%zz%4");
        assert_eq!(d("%FF"), "\u{FFFD}");
    }
}
