//! How a request's key is named in Redis: [`RedisKey`].

use std::io::{self, Write};
use std::net::IpAddr;

/// A key that can name a limit in Redis: the bytes it appends to the limit's namespace.
///
/// Every process of a fleet must write the same bytes for the same key, so the bytes are
/// the key's plain form (an IP address as text, a header value as it came), never a hash
/// that depends on the process. Two different keys must write different bytes. The bytes
/// are not the key's name in Redis: the layer names a key by a keyed hash of them under
/// the fleet's secret (see [`RedisLayerBuilder::key_secret`](super::RedisLayerBuilder::key_secret)),
/// so that a client cannot choose the Cluster slot its key lands on.
///
/// Why a trait of its own, beside [`KeyExtractor`](crate::key::KeyExtractor) and
/// `overload-signal`'s `CallerKey`: it describes a key *type*'s form across processes, not
/// how a key is taken from a request, and `Hash`, which the other two rely on, is seeded
/// per process. It is implemented on the key (`E::Lookup: RedisKey`), so an extractor of
/// yours keeps working locally whether or not its key can be named in Redis.
///
/// Implemented for the keys of the built-in extractors (an [`IpAddr`] from
/// [`ClientIp`](crate::key::ClientIp), the bytes of a [`HeaderKey`](crate::key::HeaderKey))
/// and for strings, byte strings and integers, which closures usually return. For a key
/// type of your own:
///
/// ```
/// use std::io::{self, Write};
/// use ratelimit_layer::redis::RedisKey;
///
/// #[derive(Clone, PartialEq, Eq, Hash)]
/// struct Tenant(u32);
///
/// impl RedisKey for Tenant {
///     fn write_key(&self, out: &mut dyn Write) -> io::Result<()> {
///         write!(out, "tenant-{}", self.0)
///     }
/// }
/// ```
pub trait RedisKey {
    /// Writes the bytes that name this key. `out` is the command's own buffer, so writing
    /// costs no allocation of its own; it never fails.
    ///
    /// # Errors
    ///
    /// Only what `out` returns; the buffer this crate passes never fails.
    fn write_key(&self, out: &mut dyn Write) -> io::Result<()>;
}

impl RedisKey for () {
    fn write_key(&self, _: &mut dyn Write) -> io::Result<()> {
        Ok(())
    }
}

impl RedisKey for IpAddr {
    /// The canonical text form, an IPv4-mapped IPv6 address as IPv4 (`192.0.2.1`,
    /// `2001:db8::1`).
    fn write_key(&self, out: &mut dyn Write) -> io::Result<()> {
        write!(out, "{}", self.to_canonical())
    }
}

impl RedisKey for [u8] {
    fn write_key(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self)
    }
}

impl RedisKey for str {
    fn write_key(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self.as_bytes())
    }
}

macro_rules! deref_keys {
    ($($t:ty),*) => {$(
        impl RedisKey for $t {
            fn write_key(&self, out: &mut dyn Write) -> io::Result<()> {
                (**self).write_key(out)
            }
        }
    )*};
}

deref_keys!(Box<[u8]>, Vec<u8>, Box<str>, String);

macro_rules! integer_keys {
    ($($t:ty),*) => {$(
        impl RedisKey for $t {
            fn write_key(&self, out: &mut dyn Write) -> io::Result<()> {
                write!(out, "{self}")
            }
        }
    )*};
}

integer_keys!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<K: RedisKey + ?Sized>(key: &K) -> Vec<u8> {
        let mut out = Vec::new();
        key.write_key(&mut out).unwrap();
        out
    }

    #[test]
    fn keys_write_their_plain_form() {
        assert_eq!(bytes(&"192.0.2.1".parse::<IpAddr>().unwrap()), b"192.0.2.1");
        assert_eq!(
            bytes(&"::ffff:192.0.2.1".parse::<IpAddr>().unwrap()),
            b"192.0.2.1",
            "an IPv4-mapped address names the same limit as the IPv4 address"
        );
        assert_eq!(
            bytes(&"2001:db8::1".parse::<IpAddr>().unwrap()),
            b"2001:db8::1"
        );
        assert_eq!(bytes(&b"key-1"[..]), b"key-1");
        assert_eq!(bytes(&Box::<[u8]>::from(&b"\xff\x00"[..])), b"\xff\x00");
        assert_eq!(bytes("tenant"), b"tenant");
        assert_eq!(bytes(&String::from("tenant")), b"tenant");
        assert_eq!(bytes(&-42_i64), b"-42");
        assert_eq!(bytes(&()), b"");
    }
}
