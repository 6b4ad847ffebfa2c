//! The command of one decision: `EVALSHA` with the limit's key written straight into the
//! command's buffer ([`command`]), and the call that sends the script itself when Redis
//! does not have it ([`evalsha`]).

use std::io::{self, Write};

use redis::{Arg, Cmd, ErrorKind, RedisError, RedisWrite, ServerErrorKind, ToRedisArgs, Value};

use super::connection::RedisConnection;
use super::key::RedisKey;
use super::script::{ScriptArgs, ScriptedLimit};

/// Which limit a command names.
pub(crate) enum RedisKeyName<'a, K: ?Sized> {
    /// The layer's one global limit: `g`.
    Global,
    /// A keyed limit's requests without a key, under `MissingKey::Shared`: `u`.
    Unkeyed,
    /// The shared limit of new keys refused by the cap on new keys: `o`.
    Overflow,
    /// A request's key: `k:` and the key's bytes, escaped.
    Keyed(&'a K),
}

/// The key argument: the namespace and the limit's name, written straight into the
/// command's buffer.
struct RedisKeyArg<'a, K: ?Sized> {
    namespace: &'a [u8],
    name: &'a RedisKeyName<'a, K>,
}

impl<K: RedisKey + ?Sized> ToRedisArgs for RedisKeyArg<'_, K> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let mut arg = out.writer_for_next_arg();
        // NOTE: the command's buffer is a `Vec`, whose writes never fail.
        let _ = arg.write_all(self.namespace);
        let _ = match self.name {
            RedisKeyName::Global => arg.write_all(b"g"),
            RedisKeyName::Unkeyed => arg.write_all(b"u"),
            RedisKeyName::Overflow => arg.write_all(b"o"),
            RedisKeyName::Keyed(key) => arg
                .write_all(b"k:")
                .and_then(|()| key.write_key(&mut HashTagEscape(&mut arg))),
        };
    }
}

/// Writes a key's bytes with `%`, `{` and `}` as `%25`, `%7B` and `%7D`.
///
/// A Redis Cluster puts a key in the slot of the part between its first `{` and the next
/// `}` (a hash tag), when there is one: unescaped, a client that chooses its key (a header)
/// could send every key it makes to one node. Escaped, a key's slot follows from all its
/// bytes. `%` is escaped too, so that two different keys never write the same bytes.
struct HashTagEscape<'a, W: ?Sized>(&'a mut W);

impl<W: Write + ?Sized> Write for HashTagEscape<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut rest = buf;
        while let Some(at) = rest.iter().position(|b| matches!(b, b'%' | b'{' | b'}')) {
            self.0.write_all(&rest[..at])?;
            self.0.write_all(match rest[at] {
                b'%' => b"%25",
                b'{' => b"%7B",
                _ => b"%7D",
            })?;
            rest = &rest[at + 1..];
        }
        self.0.write_all(rest)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// `EVALSHA hash 1 key ARGV...` for the limit `name` under `namespace`
/// (`{prefix}:{name}:{algorithm}:`), with the call's arguments.
pub(crate) fn command<K: RedisKey + ?Sized>(
    scripted: &ScriptedLimit,
    namespace: &[u8],
    name: &RedisKeyName<'_, K>,
    args: ScriptArgs,
) -> Cmd {
    // NOTE: 10 arguments and their bytes, so that writing them never reallocates:
    // "EVALSHA", the 40-digit hash, "1", the key (the namespace and up to 64 bytes of key,
    // typical of an address or an API key), and six short numbers.
    let mut cmd = Cmd::with_capacity(10, 64 + namespace.len() + 64 + 6 * 24);
    cmd.arg("EVALSHA")
        .arg(scripted.hash.as_bytes())
        .arg(1)
        .arg(RedisKeyArg { namespace, name });
    scripted.write_args(&mut cmd, args);
    cmd
}

/// `EVALSHA`; on `NOSCRIPT` (a restarted or flushed Redis, or a Cluster node that has not
/// run the script yet), the same call as `EVAL` with the script's code, which also caches
/// it on that node: unlike `SCRIPT LOAD`, it goes where the key goes.
///
/// A server's error reply comes back as a value (redis-rs's `Value::ServerError`), made an
/// error here.
pub(crate) async fn evalsha(
    connection: &mut RedisConnection,
    cmd: &Cmd,
    code: &str,
) -> Result<Value, RedisError> {
    match connection.send(cmd).await?.extract_error() {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            eval(connection, cmd, code).await
        }
        other => other,
    }
}

/// The call of an `EVALSHA` command as `EVAL`, with the script's code: one round trip where
/// the script may not be cached yet (a layer's first calls), instead of two.
pub(crate) async fn eval(
    connection: &mut RedisConnection,
    cmd: &Cmd,
    code: &str,
) -> Result<Value, RedisError> {
    let mut eval = redis::cmd("EVAL");
    eval.arg(code);
    // NOTE: every argument after the hash: the key count, the key, ARGV.
    for arg in cmd.args_iter().skip(2) {
        if let Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    connection.send(&eval).await?.extract_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written<K: RedisKey + ?Sized>(name: &RedisKeyName<'_, K>) -> Vec<u8> {
        let mut cmd = Cmd::new();
        cmd.arg(RedisKeyArg {
            namespace: b"ratelimit:api:tb:",
            name,
        });
        match cmd.args_iter().next() {
            Some(Arg::Simple(bytes)) => bytes.to_vec(),
            _ => panic!("no argument"),
        }
    }

    #[test]
    fn keys_cannot_choose_their_cluster_slot() {
        assert_eq!(
            written(&RedisKeyName::Keyed("{tenant}1")),
            b"ratelimit:api:tb:k:%7Btenant%7D1"
        );
        assert_eq!(
            written(&RedisKeyName::Keyed("a%7Bb")),
            b"ratelimit:api:tb:k:a%257Bb"
        );
        assert_eq!(
            written(&RedisKeyName::Keyed("192.0.2.1")),
            b"ratelimit:api:tb:k:192.0.2.1"
        );
        assert_eq!(
            written::<str>(&RedisKeyName::Overflow),
            b"ratelimit:api:tb:o"
        );
        // Two keys that would escape alike if `%` were not escaped.
        assert_ne!(
            written(&RedisKeyName::Keyed("%7B")),
            written(&RedisKeyName::Keyed("{"))
        );
    }
}
