//! The command of one decision: `EVALSHA` with the limit's key written straight into the
//! command's buffer ([`command`]), and the call that sends the script itself when Redis
//! does not have it ([`evalsha`]).

use std::io::Write;

use redis::{Arg, Cmd, ErrorKind, RedisError, RedisWrite, ServerErrorKind, ToRedisArgs, Value};

use super::connection::RedisConnection;
use super::script::{ScriptArgs, ScriptedLimit};
use super::secret::NAME_LEN;

/// Which limit a command names.
pub(crate) enum RedisKeyName {
    /// The layer's one global limit: `g`.
    Global,
    /// A keyed limit's requests without a key, under `MissingKey::Shared`: `u`.
    Unkeyed,
    /// The last overflow limit, of new keys past the cap whose network could not have one
    /// of its own (past the cap on new networks too): `o`.
    Overflow,
    /// A request's key: `k:` and its name under the fleet's secret ([`KeyNamer`]).
    ///
    /// [`KeyNamer`]: super::secret::KeyNamer
    Keyed([u8; NAME_LEN]),
    /// The overflow limit of one network's new keys past the cap: `o:` and the network's
    /// name under the fleet's secret.
    NetworkOverflow([u8; NAME_LEN]),
}

/// The key argument: the namespace and the limit's name, written straight into the
/// command's buffer.
struct RedisKeyArg<'a> {
    namespace: &'a [u8],
    name: &'a RedisKeyName,
}

impl ToRedisArgs for RedisKeyArg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let mut arg = out.writer_for_next_arg();
        // NOTE: the command's buffer is a `Vec`, whose writes never fail. A name is hex
        // digits: no `{` or `}`, so no part of a key is a Cluster hash tag (the prefix and
        // the layer's name are checked for them when the layer is built).
        let _ = arg.write_all(self.namespace);
        let _ = match self.name {
            RedisKeyName::Global => arg.write_all(b"g"),
            RedisKeyName::Unkeyed => arg.write_all(b"u"),
            RedisKeyName::Overflow => arg.write_all(b"o"),
            RedisKeyName::Keyed(name) => arg.write_all(b"k:").and_then(|()| arg.write_all(name)),
            RedisKeyName::NetworkOverflow(name) => {
                arg.write_all(b"o:").and_then(|()| arg.write_all(name))
            }
        };
    }
}

/// `EVALSHA hash 1 key ARGV...` for the limit `name` under `namespace`
/// (`{prefix}:{name}:{algorithm}:`), with the call's arguments.
pub(crate) fn command(
    scripted: &ScriptedLimit,
    namespace: &[u8],
    name: &RedisKeyName,
    args: ScriptArgs,
) -> Cmd {
    // NOTE: 10 arguments and their bytes, so that writing them never reallocates:
    // "EVALSHA", the 40-digit hash, "1", the key (the namespace and a name of 34 bytes),
    // and six short numbers.
    let mut cmd = Cmd::with_capacity(10, 64 + namespace.len() + 2 + NAME_LEN + 6 * 24);
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
    use crate::redis::secret::KeyNamer;

    fn written(name: &RedisKeyName) -> Vec<u8> {
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
    fn keys_are_named_by_their_keyed_hash() {
        let namer = KeyNamer::new(b"0123456789abcdef");
        assert_eq!(
            written(&RedisKeyName::Keyed(namer.name("alice"))),
            b"ratelimit:api:tb:k:fdbf8b1cacd3d578e062d0e41104357d"
        );
        let tagged = written(&RedisKeyName::Keyed(namer.name("{tenant}1")));
        assert!(
            !tagged.contains(&b'{') && !tagged.contains(&b'}'),
            "no hash tag"
        );
        assert_eq!(written(&RedisKeyName::Overflow), b"ratelimit:api:tb:o");
        assert!(
            written(&RedisKeyName::NetworkOverflow(namer.name(&7_u64)))
                .starts_with(b"ratelimit:api:tb:o:")
        );
        assert_eq!(written(&RedisKeyName::Global), b"ratelimit:api:tb:g");
    }
}
