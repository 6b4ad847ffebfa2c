//! The algorithms as Lua scripts: one atomic round trip per decision.

use std::time::Duration;

use overload_core::ConfigError;
use redis::{Cmd, Value};

use overload_core::clock::saturating_nanos;

use crate::algorithm::{
    Decision, Limiter, QuotaStatus, SlidingWindow, SlidingWindowView, TokenBucket,
};
use crate::rate_limit::decide::held_decision;

/// The largest integer a double (Lua's only number type in Redis) holds exactly: 2^53.
const EXACT: u64 = 1 << 53;

/// GCRA on one string key: the theoretical arrival time (TAT), in microseconds of the
/// server's clock, stored with every digit a double has.
///
/// KEYS[1]: the key. ARGV[1]: the emission interval T, microseconds (may have a
/// fraction); ARGV[2]: the tolerance B*T, microseconds; ARGV[3]: the cost n, at least 1;
/// ARGV[4]: `1` when the key may be made if it does not exist, `0` when not (the cap on new
/// keys); ARGV[5]: how many more units to take for the process's local reservation, if
/// they are there (0: none); ARGV[6]: the units the request may not take (its level's
/// held-back share; 0: none): it is admitted only if `ahead <= tolerance - held * T`;
/// ARGV[7], in this crate's tests only: the time, microseconds, instead of the server's
/// clock; keys then do not expire, since their times are not the server's.
///
/// Returns {admitted (1 or 0), retry after (microseconds, rounded up), backlog TAT - now
/// (microseconds, rounded up), units taken for the reservation, 1 if the key was made},
/// or {2, 0, 0, 0, 0} when the key does not exist and may not be made. The key expires a
/// millisecond after its TAT, when it holds no more than a missing key would.
///
/// A TAT never lies more than the tolerance ahead of the time it is written at, so one
/// further ahead means that the server's clock went back since (a clock stepped, or a
/// failover to a replica whose clock is behind): it is brought back to the tolerance, a
/// bucket just emptied, and kept so even by a rejection, so that the bucket refills on the
/// clock as it is now: a step back of D rejects for at most one emission interval rather
/// than for D.
pub(crate) const GCRA: &str = r"
local now
if ARGV[7] then
  now = tonumber(ARGV[7])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local emission = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local limit = tolerance - tonumber(ARGV[6]) * emission
local stored = redis.call('GET', KEYS[1])
if not stored and ARGV[4] == '0' then
  return {2, 0, 0, 0, 0}
end
local tat = tonumber(stored) or now
local stepped = false
if tat < now then
  tat = now
elseif tat > now + tolerance then
  tat = now + tolerance
  stepped = true
end
local ahead = tat + cost * emission - now
if ahead > limit then
  if stepped then
    -- kept, so that the bucket refills from now on, on the clock as it is now
    if ARGV[7] then
      redis.call('SET', KEYS[1], string.format('%.17g', tat))
    else
      redis.call('SET', KEYS[1], string.format('%.17g', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
    end
  end
  local wait = ahead - limit
  if cost * emission > limit then
    -- cost + held > burst: no backlog is short enough; the time until the bucket is full
    wait = math.max(tat - now, 1)
  end
  return {0, math.ceil(wait), math.ceil(tat - now), 0, 0}
end
local extra = math.min(tonumber(ARGV[5]), math.floor((limit - ahead) / emission))
if extra > 0 then
  ahead = ahead + extra * emission
else
  extra = 0
end
if ARGV[7] then
  redis.call('SET', KEYS[1], string.format('%.17g', now + ahead))
else
  redis.call('SET', KEYS[1], string.format('%.17g', now + ahead), 'PX', math.ceil(ahead / 1000) + 1)
end
local made = 0
if not stored then
  made = 1
end
return {1, 0, math.ceil(ahead), extra, made}
";

/// The paper's sliding window on one hash key: `i`, the number of the current window
/// (`floor(now / w)`), `c` its count, and `p` the previous window's count.
///
/// KEYS[1]: the key. ARGV[1]: the window w, whole microseconds; ARGV[2]: the quota;
/// ARGV[3]: the cost n, at least 1; ARGV[4]: `1` when the key may be made, `0` when not;
/// ARGV[5]: how many more units to take for the local reservation, if they are there;
/// ARGV[6]: the units the request may not take (its level's held-back share; 0: none): it
/// is admitted as a request of `n + held` would be; ARGV[7], in this crate's tests only: the
/// time (keys then do not expire).
///
/// Admits when `(c + n - 1) * w + left * p < quota * w` (the local rule, in integers that a
/// double holds exactly: the builder checks `quota * w <= 2^53`); then takes up to ARGV[5]
/// more while the rule holds (`quota - floor(left * p / w) - c` is what it still admits).
/// Returns {admitted, c (with what was taken if admitted), p, left (microseconds), units
/// taken for the reservation, 1 if the key was made}, or {2, 0, 0, 0, 0, 0} when the key
/// does not exist and may not be made. The key expires two windows after its last
/// admission, when both counts it holds have passed.
///
/// When the server's clock goes back into an earlier window (a step, or a failover to a
/// replica whose clock is behind), the stored window becomes the current one with its
/// counts: the limit holds, and a full window rejects for at most a window, rather than
/// until the clock is back where it was.
pub(crate) const SLIDING_WINDOW: &str = r"
local now
if ARGV[7] then
  now = tonumber(ARGV[7])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local w = tonumber(ARGV[1])
local quota = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local held = tonumber(ARGV[6])
local index = math.floor(now / w)
local left = w - (now - index * w)
local s = redis.call('HMGET', KEYS[1], 'i', 'c', 'p')
local si = tonumber(s[1])
local c = tonumber(s[2]) or 0
local p = tonumber(s[3]) or 0
local made = 0
if si == nil then
  if ARGV[4] == '0' then
    return {2, 0, 0, 0, 0, 0}
  end
  made = 1
  si = index
  c = 0
  p = 0
elseif index > si then
  if index == si + 1 then
    p = c
  else
    p = 0
  end
  c = 0
  si = index
elseif index < si then
  -- the server's clock went back: the stored window becomes the current one, kept so even
  -- by a rejection, so that windows roll on the clock as it is now
  si = index
  redis.call('HSET', KEYS[1], 'i', string.format('%d', si))
end
if cost + held <= quota and (c + cost + held - 1) * w + left * p < quota * w then
  c = c + cost
  local extra = math.min(tonumber(ARGV[5]), quota - held - math.floor(left * p / w) - c)
  if extra > 0 then
    c = c + extra
  else
    extra = 0
  end
  redis.call('HSET', KEYS[1], 'i', string.format('%d', si), 'c', string.format('%d', c), 'p', string.format('%d', p))
  if not ARGV[7] then
    redis.call('PEXPIRE', KEYS[1], math.ceil(2 * w / 1000) + 1)
  end
  return {1, c, p, left, extra, made}
end
return {0, c, p, left, 0, 0}
";

/// An algorithm whose limit can be kept in Redis: [`TokenBucket`] and [`SlidingWindow`].
///
/// [`RateLimitBuilder::redis`](crate::RateLimitBuilder::redis) takes a limiter of such a
/// type. Sealed: the scripts are this crate's.
pub trait RedisAlgorithm: Limiter + Clone + Sealed {}

pub(crate) use sealed::Sealed;

impl RedisAlgorithm for TokenBucket {}
impl RedisAlgorithm for SlidingWindow {}

mod sealed {
    use overload_core::ConfigError;

    use crate::redis::script::ScriptedLimit;

    pub trait Sealed: Sized {
        /// The script and its constant arguments, or why the limit cannot be kept in Redis.
        fn scripted(&self) -> Result<ScriptedLimit, ConfigError>;

        /// The same limit scaled by `share` (0 < share <= 1), each number rounded up and at
        /// least 1: a process's part of the limit when Redis is away.
        fn share(&self, share: f64) -> Result<Self, ConfigError>;
    }
}

/// `n * share`, rounded up, at least 1, as a `u32`.
fn scale(n: u64, share: f64) -> u32 {
    // NOTE: share is within (0, 1], checked by the builder, so the product is within
    // [0, n] and fits in a u32 when n does.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let scaled = (n as f64 * share).ceil() as u32;
    scaled.max(1)
}

impl Sealed for TokenBucket {
    fn scripted(&self) -> Result<ScriptedLimit, ConfigError> {
        let emission = u64::try_from(self.emission_interval().as_nanos()).unwrap_or(u64::MAX);
        if emission < 1_000 {
            return Err(ConfigError::conflict(
                "rate",
                format_args!(
                    "rate ({}) per period ({:?}) must leave at least one microsecond between \
                     units in Redis, got an emission interval of {emission}ns",
                    self.rate(),
                    self.period()
                ),
            ));
        }
        let tolerance = emission * u64::from(self.burst());
        if tolerance / 1_000 >= EXACT {
            return Err(ConfigError::conflict(
                "burst",
                format_args!(
                    "burst ({}) times the emission interval must be under 2^53 microseconds \
                     (285 years) in Redis",
                    self.burst()
                ),
            ));
        }
        Ok(ScriptedLimit {
            kind: ScriptKind::Gcra {
                emission,
                tolerance,
            },
            code: GCRA,
            hash: hash(GCRA),
            tag: "tb",
            args: [micros(emission), micros(tolerance)],
        })
    }

    fn share(&self, share: f64) -> Result<Self, ConfigError> {
        Self::builder(scale(u64::from(self.rate()), share))
            .period(self.period())
            .burst(scale(u64::from(self.burst()), share))
            .build()
    }
}

impl Sealed for SlidingWindow {
    fn scripted(&self) -> Result<ScriptedLimit, ConfigError> {
        let w = saturating_nanos(self.window());
        if w % 1_000 != 0 {
            return Err(ConfigError::out_of_range(
                "window",
                self.window(),
                "a whole number of microseconds in Redis",
            ));
        }
        let w_us = w / 1_000;
        if self.quota().saturating_mul(w_us) > EXACT {
            return Err(ConfigError::conflict(
                "quota",
                format_args!(
                    "quota ({}) times the window in microseconds ({w_us}) must be at most 2^53 \
                     in Redis, whose scripts compute in doubles",
                    self.quota()
                ),
            ));
        }
        Ok(ScriptedLimit {
            kind: ScriptKind::SlidingWindow(self.clone()),
            code: SLIDING_WINDOW,
            hash: hash(SLIDING_WINDOW),
            tag: "sw",
            args: [w_us.to_string(), self.quota().to_string()],
        })
    }

    fn share(&self, share: f64) -> Result<Self, ConfigError> {
        Self::builder(scale(self.quota(), share))
            .window(self.window())
            .build()
    }
}

/// `nanos` as microseconds in decimal, exactly (`3333333` -> `3333.333`).
fn micros(nanos: u64) -> String {
    let (whole, frac) = (nanos / 1_000, nanos % 1_000);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{frac:03}")
    }
}

fn hash(code: &str) -> String {
    redis::Script::new(code).get_hash().to_owned()
}

/// A limiter as a script: its code and hash, its constant arguments, and how to read its
/// replies.
#[derive(Clone, Debug)]
pub struct ScriptedLimit {
    kind: ScriptKind,
    pub(crate) code: &'static str,
    pub(crate) hash: String,
    /// The algorithm's part of the key namespace: `tb` or `sw`, so that two limits of the
    /// same name with different algorithms never read each other's keys.
    pub(crate) tag: &'static str,
    /// ARGV[1] and ARGV[2], formatted once.
    args: [String; 2],
}

#[derive(Clone, Debug)]
enum ScriptKind {
    Gcra { emission: u64, tolerance: u64 },
    SlidingWindow(SlidingWindow),
}

/// A reply that is not what the script returns.
#[derive(Debug)]
pub(crate) struct UnexpectedReply(pub(crate) String);

/// The arguments of one call after the constant ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScriptArgs {
    /// What the request costs, at least 1.
    pub(crate) cost: u32,
    /// Whether the key may be made if it does not exist (the cap on new keys).
    pub(crate) may_create: bool,
    /// How many more units to take, if they are there, for the local reservation.
    pub(crate) extra: u32,
    /// The units the request may not take: its level's held-back share (0: none).
    pub(crate) held: u64,
    /// The time, microseconds, instead of the server's clock: this crate's tests only.
    pub(crate) now_micros: Option<u64>,
}

impl ScriptArgs {
    /// A plain decision of `cost`.
    pub(crate) const fn cost(cost: u32) -> Self {
        Self {
            cost,
            may_create: true,
            extra: 0,
            held: 0,
            now_micros: None,
        }
    }
}

/// What a script answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScriptReply {
    /// The request was decided: the decision, the quota's status after it (what was taken
    /// for the reservation included), how many units were taken for the reservation, and
    /// whether the key was made by this call.
    Decided {
        decision: Decision,
        status: QuotaStatus,
        extra: u32,
        made: bool,
    },
    /// The key does not exist, and the call said it may not be made.
    NoSuchKey,
}

impl ScriptedLimit {
    /// Appends the call's arguments after the key: ARGV.
    pub(crate) fn write_args(&self, cmd: &mut Cmd, args: ScriptArgs) {
        cmd.arg(self.args[0].as_bytes())
            .arg(self.args[1].as_bytes())
            .arg(args.cost)
            .arg(if args.may_create { "1" } else { "0" })
            .arg(args.extra)
            .arg(args.held);
        if let Some(now) = args.now_micros {
            cmd.arg(now);
        }
    }

    /// The reply to a request of `cost`, read strictly.
    pub(crate) fn read_reply(
        &self,
        reply: &Value,
        cost: u32,
    ) -> Result<ScriptReply, UnexpectedReply> {
        self.read_reply_held(reply, cost, 0)
    }

    /// The reply to a request of `cost` that was asked to leave `held` units, read
    /// strictly; a rejection's wait as [`Limiter::check_holding_back`] gives it locally,
    /// and at least the window of the levels' activity when no wait lets it in while the
    /// units stay held (as the local decision's).
    pub(crate) fn read_reply_held(
        &self,
        reply: &Value,
        cost: u32,
        held: u64,
    ) -> Result<ScriptReply, UnexpectedReply> {
        let unexpected = || UnexpectedReply(format!("{reply:?}"));
        let Value::Array(items) = reply else {
            return Err(unexpected());
        };
        let mut numbers = [0u64; 6];
        let arity = match self.kind {
            ScriptKind::Gcra { .. } => 5,
            ScriptKind::SlidingWindow(_) => 6,
        };
        if items.len() != arity {
            return Err(unexpected());
        }
        for (slot, item) in numbers.iter_mut().zip(items) {
            *slot = match item {
                Value::Int(n) => u64::try_from(*n).map_err(|_| unexpected())?,
                _ => return Err(unexpected()),
            };
        }
        let admitted = match numbers[0] {
            0 => false,
            1 => true,
            2 => return Ok(ScriptReply::NoSuchKey),
            _ => return Err(unexpected()),
        };
        let extra = u32::try_from(numbers[arity - 2]).map_err(|_| unexpected())?;
        let made = match numbers[arity - 1] {
            0 => false,
            1 => true,
            _ => return Err(unexpected()),
        };
        if !admitted && (extra != 0 || made) {
            return Err(unexpected());
        }
        let nanos = |micros: u64| micros.saturating_mul(1_000);
        let (decision, status) = match &self.kind {
            ScriptKind::Gcra {
                emission,
                tolerance,
            } => {
                let backlog = nanos(numbers[2]);
                let decision = if admitted {
                    Decision::Allow
                } else {
                    Decision::Reject {
                        retry_after: Duration::from_nanos(nanos(numbers[1])),
                    }
                };
                // NOTE: as `TokenBucket::status`.
                let status = QuotaStatus {
                    remaining: tolerance.saturating_sub(backlog) / emission,
                    reset: Duration::from_nanos(backlog),
                };
                (decision, status)
            }
            ScriptKind::SlidingWindow(limiter) => {
                // NOTE: the script applies the limiter's own rule to the counts it keeps, and
                // returns them: the wait and the remaining quota follow from them as they do
                // locally, with the count that includes this request's cost if admitted.
                let view = SlidingWindowView {
                    current: numbers[1],
                    previous: numbers[2],
                    left: nanos(numbers[3]).min(saturating_nanos(limiter.window())),
                };
                let need = u64::from(cost).max(1).saturating_add(held);
                let decision = if admitted {
                    Decision::Allow
                } else if need > limiter.quota() {
                    Decision::Reject {
                        retry_after: limiter.until_whole(&view),
                    }
                } else {
                    Decision::Reject {
                        retry_after: limiter.retry_after(&view, need),
                    }
                };
                let status = QuotaStatus {
                    remaining: limiter.remaining(&view),
                    reset: Duration::from_nanos(view.left),
                };
                (decision, status)
            }
        };
        let capacity = match &self.kind {
            ScriptKind::Gcra {
                emission,
                tolerance,
            } => tolerance / emission,
            ScriptKind::SlidingWindow(limiter) => limiter.quota(),
        };
        Ok(ScriptReply::Decided {
            decision: held_decision(decision, cost, held, capacity),
            status,
            extra,
            made,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::sealed::Sealed;
    use super::*;
    use overload_core::ConfigErrorKind;

    #[test]
    fn constant_arguments_are_exact_decimals() {
        assert_eq!(micros(3_333_333), "3333.333");
        assert_eq!(micros(100_000_000), "100000");
        assert_eq!(micros(1_005), "1.005");
        let bucket = TokenBucket::builder(300).burst(30).build().unwrap();
        let s = bucket.scripted().unwrap();
        assert_eq!(s.args, ["3333.333".to_owned(), "99999.990".to_owned()]);
        assert_eq!(s.tag, "tb");
        assert_eq!(s.hash.len(), 40);
        let s = SlidingWindow::new(600).unwrap().scripted().unwrap();
        assert_eq!(s.args, ["1000000".to_owned(), "600".to_owned()]);
        assert_eq!(s.tag, "sw");
    }

    #[test]
    fn limits_redis_cannot_hold_exactly_are_refused_by_name() {
        let err = TokenBucket::new(2_000_000).unwrap().scripted().unwrap_err();
        assert_eq!(
            (err.field(), err.kind()),
            ("rate", ConfigErrorKind::Conflict)
        );
        assert!(err.to_string().contains("one microsecond"), "{err}");
        let err = SlidingWindow::builder(10)
            .window(Duration::from_nanos(1_500))
            .build()
            .unwrap()
            .scripted()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "window must be a whole number of microseconds in Redis, got 1.5µs"
        );
        let err = SlidingWindow::builder(u32::MAX)
            .window(Duration::from_secs(3_600))
            .build()
            .unwrap()
            .scripted()
            .unwrap_err();
        assert_eq!(err.field(), "quota");
    }

    #[test]
    fn shares_round_up_and_keep_at_least_one() {
        let bucket = TokenBucket::builder(300).burst(30).build().unwrap();
        let third = bucket.share(1.0 / 3.0).unwrap();
        assert_eq!((third.rate(), third.burst()), (100, 10));
        let tiny = bucket.share(0.001).unwrap();
        assert_eq!((tiny.rate(), tiny.burst()), (1, 1));
        assert_eq!(bucket.share(1.0).unwrap(), bucket);
        let window = SlidingWindow::new(10).unwrap().share(0.25).unwrap();
        assert_eq!(window.quota(), 3);
    }

    #[test]
    fn replies_are_read_strictly() {
        let bucket = TokenBucket::builder(10).burst(5).build().unwrap();
        let s = bucket.scripted().unwrap();
        let reply = |v: &[i64]| Value::Array(v.iter().map(|&n| Value::Int(n)).collect());
        assert_eq!(
            s.read_reply(&reply(&[1, 0, 300_000, 0, 1]), 1).unwrap(),
            ScriptReply::Decided {
                decision: Decision::Allow,
                status: QuotaStatus {
                    remaining: 2,
                    reset: Duration::from_millis(300)
                },
                extra: 0,
                made: true,
            }
        );
        assert_eq!(
            s.read_reply(&reply(&[0, 100_000, 500_000, 0, 0]), 1)
                .unwrap(),
            ScriptReply::Decided {
                decision: Decision::Reject {
                    retry_after: Duration::from_millis(100)
                },
                status: QuotaStatus {
                    remaining: 0,
                    reset: Duration::from_millis(500)
                },
                extra: 0,
                made: false,
            }
        );
        assert_eq!(
            s.read_reply(&reply(&[1, 0, 400_000, 2, 0]), 1).unwrap(),
            ScriptReply::Decided {
                decision: Decision::Allow,
                status: QuotaStatus {
                    remaining: 1,
                    reset: Duration::from_millis(400)
                },
                extra: 2,
                made: false,
            }
        );
        assert_eq!(
            s.read_reply(&reply(&[2, 0, 0, 0, 0]), 1).unwrap(),
            ScriptReply::NoSuchKey
        );
        for bad in [
            reply(&[1, 0, 0, 0]),
            reply(&[3, 0, 0, 0, 0]),
            reply(&[1, -1, 0, 0, 0]),
            reply(&[0, 1, 0, 1, 0]),
            reply(&[0, 1, 0, 0, 1]),
            reply(&[1, 0, 0, 0, 2]),
            Value::Nil,
            Value::Array(vec![
                Value::Okay,
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
            ]),
        ] {
            assert!(s.read_reply(&bad, 1).is_err(), "{bad:?}");
        }
    }
}
