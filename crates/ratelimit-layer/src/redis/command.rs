//! The command of one decision: `EVALSHA` with the limit's key written straight into the
//! command's buffer ([`command`]), and the call that reloads the script when Redis lost it
//! ([`evalsha`]).

use std::io::Write;

use redis::aio::ConnectionManager;
use redis::{Cmd, ErrorKind, RedisError, RedisWrite, ServerErrorKind, ToRedisArgs, Value};

use super::key::RedisKey;
use super::script::ScriptedLimit;

/// Which limit a command names.
pub(crate) enum RedisKeyName<'a, K: ?Sized> {
    /// The layer's one global limit: `g`.
    Global,
    /// A keyed limit's requests without a key, under `MissingKey::Shared`: `u`.
    Unkeyed,
    /// A request's key: `k:` and the key's bytes.
    Keyed(&'a K),
}

/// The key argument: the namespace and the limit's name, written straight into the
/// command's buffer.
struct RedisKeyArg<'a, K: ?Sized> {
    namespace: &'a [u8],
    name: RedisKeyName<'a, K>,
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
            RedisKeyName::Keyed(key) => arg.write_all(b"k:").and_then(|()| key.write_key(&mut arg)),
        };
    }
}

/// `EVALSHA hash 1 key ARGV...` for a request of `cost` against the limit `name` under
/// `namespace` (`{prefix}:{name}:{algorithm}:`); `now_micros` only in tests.
pub(crate) fn command<K: RedisKey + ?Sized>(
    scripted: &ScriptedLimit,
    namespace: &[u8],
    name: RedisKeyName<'_, K>,
    cost: u32,
    now_micros: Option<u64>,
) -> Cmd {
    // NOTE: 8 arguments and their bytes, so that writing them never reallocates: "EVALSHA",
    // the 40-digit hash, "1", the key (the namespace and up to 64 bytes of key, typical of
    // an address or an API key), and four short numbers.
    let mut cmd = Cmd::with_capacity(8, 64 + namespace.len() + 64 + 4 * 24);
    cmd.arg("EVALSHA")
        .arg(scripted.hash.as_bytes())
        .arg(1)
        .arg(RedisKeyArg { namespace, name });
    scripted.write_args(&mut cmd, cost, now_micros);
    cmd
}

/// `EVALSHA`; on `NOSCRIPT` (a restarted or flushed Redis), `SCRIPT LOAD` and once more.
///
/// A server's error reply comes back as a value (redis-rs's `Value::ServerError`), made an
/// error here.
pub(crate) async fn evalsha(
    connection: &mut ConnectionManager,
    cmd: &Cmd,
    code: &str,
) -> Result<Value, RedisError> {
    match connection.send_packed_command(cmd).await?.extract_error() {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(code);
            connection
                .send_packed_command(&load)
                .await?
                .extract_error()?;
            connection.send_packed_command(cmd).await?.extract_error()
        }
        other => other,
    }
}
