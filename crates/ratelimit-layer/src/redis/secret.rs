//! How a client's key is named in Redis: a keyed hash under the fleet's secret
//! ([`KeyNamer`]), and where that secret comes from ([`FleetSecret`]): given to the builder,
//! or kept in Redis, made there once by the first process that needs it.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use hmac::{Hmac, Mac};
use redis::{ErrorKind, RedisError, Value};
use sha2::Sha256;

use super::connection::RedisConnection;
use super::key::RedisKey;

/// The fewest bytes a secret may have: 16, 128 bits.
pub(crate) const MIN_SECRET_LEN: usize = 16;

/// How many recheck intervals pass between two reads of the secret kept in Redis: 20 (10 s
/// with the default interval of 500 ms).
pub(crate) const SECRET_RECHECK_TICKS: u32 = 20;

/// The hex digits of a name: the first 128 bits of the HMAC.
pub(crate) const NAME_LEN: usize = 32;

/// Names keys under one secret: HMAC-SHA-256 of the key's bytes ([`RedisKey`]), its first
/// 128 bits as 32 lower-case hex digits.
///
/// NOTE: a keyed hash, not CRC16 of the key itself: a client that chooses its key (a
/// header) cannot compute which Cluster slot its key's name lands in without the secret,
/// so it cannot put its keys on one master. Hex digits never hold a `{` or `}`, so no name
/// is a hash tag either. 128 bits: two keys share a name (and a limit) with a chance of
/// about `n^2 / 2^129` for `n` keys.
#[derive(Clone)]
pub(crate) struct KeyNamer {
    mac: Hmac<Sha256>,
}

impl KeyNamer {
    pub(crate) fn new(secret: &[u8]) -> Self {
        Self {
            // NOTE: HMAC takes a key of any length; the builder refuses one under 16 bytes.
            mac: <Hmac<Sha256> as Mac>::new_from_slice(secret)
                .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length")),
        }
    }

    /// The name of `key` (32 hex digits), without allocating.
    pub(crate) fn name<K: RedisKey + ?Sized>(&self, key: &K) -> [u8; NAME_LEN] {
        let mut mac = self.mac.clone();
        // NOTE: the MAC's writer never fails.
        let _ = key.write_key(&mut MacWriter(&mut mac));
        hex(&mac.finalize().into_bytes()[..NAME_LEN / 2])
    }
}

fn hex(bytes: &[u8]) -> [u8; NAME_LEN] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0; NAME_LEN];
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
    out
}

struct MacWriter<'a>(&'a mut Hmac<Sha256>);

impl Write for MacWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sets the key to the secret given unless it holds one, and returns what it holds: one
/// atomic step, on the node of the key's slot in a Cluster (Redis 5.0 has no `SET NX GET`).
const SECRET_SCRIPT: &str = "redis.call('SET', KEYS[1], ARGV[1], 'NX')\n\
                             return redis.call('GET', KEYS[1])";

/// The secret a layer names keys with.
pub(crate) struct FleetSecret {
    /// Whether the secret was given to the builder: then it is never read from Redis.
    given: bool,
    /// The secret and its namer, once known.
    current: RwLock<Option<(Arc<[u8]>, KeyNamer)>>,
    /// `{prefix}:secret`.
    key: Vec<u8>,
    /// One read of the secret at a time; the others wait for its answer.
    loading: tokio::sync::Mutex<()>,
    /// Ticks since the secret kept in Redis was last read.
    ticks: AtomicU32,
    /// Whether a recheck is under way.
    checking: AtomicBool,
}

impl FleetSecret {
    pub(crate) fn new(given: Option<&[u8]>, prefix: &str) -> Self {
        Self {
            given: given.is_some(),
            current: RwLock::new(given.map(|s| (Arc::from(s), KeyNamer::new(s)))),
            key: format!("{prefix}:secret").into_bytes(),
            loading: tokio::sync::Mutex::new(()),
            ticks: AtomicU32::new(0),
            checking: AtomicBool::new(false),
        }
    }

    /// The namer, once the secret is known.
    #[inline]
    pub(crate) fn namer(&self) -> Option<KeyNamer> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(_, namer)| namer.clone())
    }

    /// The namer: the one known, or else the secret kept in Redis, which this call makes
    /// (a random one, `SET NX`) if no process has yet. One call asks Redis at a time.
    pub(crate) async fn load(
        &self,
        connection: &mut RedisConnection,
    ) -> Result<KeyNamer, RedisError> {
        let _one = self.loading.lock().await;
        if let Some(namer) = self.namer() {
            return Ok(namer);
        }
        let fresh = random_secret()?;
        let kept = self.exchange(connection, &fresh).await?;
        let namer = KeyNamer::new(&kept);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) =
            Some((Arc::from(kept), namer.clone()));
        Ok(namer)
    }

    /// Once a recheck interval: whether the secret kept in Redis is due to be read again
    /// (and no read is under way); the caller then runs [`recheck`](Self::recheck).
    pub(crate) fn recheck_due(&self) -> bool {
        if self.given || self.namer().is_none() {
            return false;
        }
        let ticks = self.ticks.fetch_add(1, Ordering::Relaxed) + 1;
        if ticks < SECRET_RECHECK_TICKS {
            return false;
        }
        self.ticks.store(0, Ordering::Relaxed);
        !self.checking.swap(true, Ordering::AcqRel)
    }

    /// Reads the secret kept in Redis again, writing this process's own back if the key is
    /// gone (Redis flushed, or restarted without persistence, or a failover that lost it):
    /// the fleet keeps the secret it had. If Redis holds another one (a process made it
    /// while the key was gone, and others may have taken it), this process takes it and
    /// says so at `WARN`: processes that disagree would name each key twice, and each
    /// limit would admit up to twice its quota. Returns whether it changed.
    pub(crate) async fn recheck(&self, connection: &mut RedisConnection, name: &str) -> bool {
        let ours = self
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(secret, _)| Arc::clone(secret));
        match ours {
            None => false,
            Some(ours) => match self.exchange(connection, &ours).await {
                Ok(kept) if *kept != *ours => {
                    tracing::warn!(
                        name,
                        key = %String::from_utf8_lossy(&self.key),
                        "ratelimit-layer: the secret that names rate-limit keys in Redis \
                         changed (another process made a new one while the key was gone); \
                         this process takes it, so that the fleet names each key alike: \
                         the limits' keys start afresh"
                    );
                    let namer = KeyNamer::new(&kept);
                    *self.current.write().unwrap_or_else(PoisonError::into_inner) =
                        Some((Arc::from(kept), namer));
                    true
                }
                Ok(_) => false,
                Err(e) => {
                    tracing::debug!(name, error = %e, "could not read the key secret kept in Redis");
                    false
                }
            },
        }
    }

    /// A recheck is over (however it ended): the next may start when due.
    pub(crate) fn recheck_done(&self) {
        self.checking.store(false, Ordering::Release);
    }

    /// `SET key secret NX`, then `GET key`, in one script.
    async fn exchange(
        &self,
        connection: &mut RedisConnection,
        secret: &[u8],
    ) -> Result<Vec<u8>, RedisError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SECRET_SCRIPT).arg(1).arg(&self.key).arg(secret);
        match connection.send(&cmd).await?.extract_error()? {
            Value::BulkString(kept) if kept.len() >= MIN_SECRET_LEN => Ok(kept),
            _ => Err(RedisError::from((
                ErrorKind::Client,
                "the rate-limit key secret kept in Redis is not a string of at least 16 bytes",
                String::from_utf8_lossy(&self.key).into_owned(),
            ))),
        }
    }
}

/// 32 random bytes from the operating system, as 64 hex digits: text that an operator can
/// read with `redis-cli` and give to a builder.
fn random_secret() -> Result<Vec<u8>, RedisError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        RedisError::from((
            ErrorKind::Client,
            "no randomness from the operating system for the key secret",
            e.to_string(),
        ))
    })?;
    let (high, low) = bytes.split_at(16);
    let mut text = hex(high).to_vec();
    text.extend_from_slice(&hex(low));
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_a_keyed_hash_stable_across_processes() {
        let one = KeyNamer::new(b"0123456789abcdef");
        let again = KeyNamer::new(b"0123456789abcdef");
        let other = KeyNamer::new(b"0123456789abcdeF");
        assert_eq!(one.name("alice"), again.name("alice"));
        assert_ne!(one.name("alice"), other.name("alice"));
        assert_ne!(one.name("alice"), one.name("bob"));
        // HMAC-SHA-256("0123456789abcdef", "alice"), its first 16 bytes: a fixed value, so
        // that no upgrade of this crate or of Rust renames a fleet's keys.
        assert_eq!(
            std::str::from_utf8(&one.name("alice")).unwrap(),
            EXPECTED_ALICE
        );
        assert!(
            one.name("alice")
                .iter()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }

    /// Computed apart (Python's `hmac.new(b"0123456789abcdef", b"alice", "sha256")`).
    const EXPECTED_ALICE: &str = "fdbf8b1cacd3d578e062d0e41104357d";

    #[test]
    fn random_secrets_are_64_hex_digits_and_differ() {
        let (a, b) = (random_secret().unwrap(), random_secret().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.iter().all(u8::is_ascii_hexdigit));
        assert_ne!(a, b);
    }
}
