//! `X-Request-Criticality`: how much the caller needs the answer, in the four levels of the
//! SRE book's criticality.

use std::fmt;
use std::str::FromStr;

use http::{HeaderMap, HeaderValue};

use super::headers::X_REQUEST_CRITICALITY;

/// How much a request matters to its caller: the four levels of criticality that Google's SRE
/// book describes ("Handling Overload"), from the first to shed to the last.
///
/// Levels are ordered: `Sheddable < SheddablePlus < Critical < CriticalPlus`. Every limit of
/// this workspace sheds from the bottom: while a lower level is still admitted, no higher
/// level is rejected. The [default](Criticality::default) is [`Critical`](Self::Critical),
/// the level of serving traffic, so a fleet where nobody sets a level behaves as before.
///
/// | level | on the wire | meant for |
/// |---|---|---|
/// | [`CriticalPlus`](Self::CriticalPlus) | `critical-plus` | the most important requests: their failure is visible to users and hurts badly (a checkout, a login). Servers let only callers they trust claim it |
/// | [`Critical`](Self::Critical) | `critical` | the default: serving traffic whose failure users see |
/// | [`SheddablePlus`](Self::SheddablePlus) | `sheddable-plus` | traffic that tolerates some unavailability: batch jobs that retry in minutes, prefetches that are often used |
/// | [`Sheddable`](Self::Sheddable) | `sheddable` | traffic that may fail often and for long: speculative prefetches, best-effort analytics |
///
/// On the wire it is the header [`X-Request-Criticality`](super::X_REQUEST_CRITICALITY)
/// (gRPC metadata of the same name), one of the four values above. Parsing is strict and
/// never fails a request: ASCII case is ignored and `_` may stand for `-`
/// (`CRITICAL_PLUS`, as gRPC's own enum spells it), but anything else (another word,
/// whitespace inside, two different values) is [no level at all](Self::from_headers), and the
/// server's default applies.
///
/// ```
/// use overload_signal::protocol::Criticality;
///
/// assert!(Criticality::Sheddable < Criticality::Critical);
/// assert_eq!(Criticality::default(), Criticality::Critical);
/// assert_eq!("critical-plus".parse(), Ok(Criticality::CriticalPlus));
/// assert_eq!("SHEDDABLE_PLUS".parse(), Ok(Criticality::SheddablePlus));
/// assert!("urgent".parse::<Criticality>().is_err());
/// assert_eq!(Criticality::Sheddable.as_str(), "sheddable");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Criticality {
    /// May fail often and for long; shed first.
    Sheddable,
    /// Tolerates some unavailability; shed after [`Sheddable`](Self::Sheddable).
    SheddablePlus,
    /// Serving traffic: the default.
    #[default]
    Critical,
    /// The most important requests; shed last.
    CriticalPlus,
}

impl Criticality {
    /// The four levels, from the first shed to the last.
    pub const ALL: [Self; 4] = [
        Self::Sheddable,
        Self::SheddablePlus,
        Self::Critical,
        Self::CriticalPlus,
    ];

    /// The level's name on the wire (and in metrics' `criticality` label): `critical-plus`,
    /// `critical`, `sheddable-plus` or `sheddable`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Sheddable => "sheddable",
            Self::SheddablePlus => "sheddable-plus",
            Self::Critical => "critical",
            Self::CriticalPlus => "critical-plus",
        }
    }

    /// The level's rank, `0` for [`Sheddable`](Self::Sheddable) to `3` for
    /// [`CriticalPlus`](Self::CriticalPlus): an index into per-level tables.
    pub const fn rank(self) -> usize {
        self as usize
    }

    /// The header value of the level.
    pub const fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(self.as_str())
    }

    /// Parses one value: one of the four names, ASCII case ignored, `_` for `-` allowed,
    /// whitespace around it ignored; `None` for anything else.
    pub fn parse(value: &[u8]) -> Option<Self> {
        let value = value.trim_ascii();
        // NOTE: the longest name is 14 bytes; a longer value is junk before any comparison.
        if value.len() > 14 {
            return None;
        }
        let mut lower = [0u8; 14];
        for (to, &from) in lower.iter_mut().zip(value) {
            *to = match from {
                b'_' => b'-',
                b => b.to_ascii_lowercase(),
            };
        }
        match &lower[..value.len()] {
            b"sheddable" => Some(Self::Sheddable),
            b"sheddable-plus" => Some(Self::SheddablePlus),
            b"critical" => Some(Self::Critical),
            b"critical-plus" => Some(Self::CriticalPlus),
            _ => None,
        }
    }

    /// The level a request's headers carry in `X-Request-Criticality`; `None` when it is
    /// absent or malformed (not one of the names, or repeated with different levels).
    ///
    /// ```
    /// use http::HeaderMap;
    /// use overload_signal::protocol::{Criticality, X_REQUEST_CRITICALITY};
    ///
    /// let mut headers = HeaderMap::new();
    /// assert_eq!(Criticality::from_headers(&headers), None);
    /// headers.insert(X_REQUEST_CRITICALITY, "sheddable".parse().unwrap());
    /// assert_eq!(Criticality::from_headers(&headers), Some(Criticality::Sheddable));
    /// headers.append(X_REQUEST_CRITICALITY, "critical-plus".parse().unwrap());
    /// assert_eq!(Criticality::from_headers(&headers), None, "two levels: neither is believed");
    /// ```
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let mut values = headers.get_all(X_REQUEST_CRITICALITY).iter();
        let first = Self::parse(values.next()?.as_bytes())?;
        values
            .all(|value| Self::parse(value.as_bytes()) == Some(first))
            .then_some(first)
    }

    /// The level of a request with these extensions, as the server layers set it: the
    /// [`Criticality`] in them, or [`Critical`](Self::Critical) when there is none.
    ///
    /// The server layers ([`CriticalityLayer`](crate::criticality::CriticalityLayer),
    /// `ratelimit-layer`'s `OverloadProtectionLayer`) put a level in the extensions only when
    /// it is not `Critical` ([`set_in`](Self::set_in)): most requests carry no level, and an
    /// insert into the extensions is most of what carrying one would cost. Read the level
    /// with this function, not with `extensions.get::<Criticality>()` alone.
    ///
    /// ```
    /// use http::Extensions;
    /// use overload_signal::protocol::Criticality;
    ///
    /// let mut extensions = Extensions::new();
    /// assert_eq!(Criticality::of(&extensions), Criticality::Critical);
    /// Criticality::Sheddable.set_in(&mut extensions);
    /// assert_eq!(Criticality::of(&extensions), Criticality::Sheddable);
    /// ```
    #[inline]
    pub fn of(extensions: &http::Extensions) -> Self {
        extensions.get::<Self>().copied().unwrap_or(Self::Critical)
    }

    /// Makes `self` the level [`of`](Self::of) these extensions reads: inserts it, or, for
    /// [`Critical`](Self::Critical), removes nothing but inserts nothing either unless another
    /// level is there to replace.
    #[inline]
    pub fn set_in(self, extensions: &mut http::Extensions) {
        if Self::of(extensions) != self {
            extensions.insert(self);
        }
    }

    /// Whether `X-Request-Criticality` is present on `headers` but carries no level
    /// [`from_headers`](Self::from_headers) accepts.
    pub fn is_malformed_in(headers: &HeaderMap) -> bool {
        headers.contains_key(X_REQUEST_CRITICALITY) && Self::from_headers(headers).is_none()
    }
}

impl fmt::Display for Criticality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing a [`Criticality`] from text that names no level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownCriticality;

impl fmt::Display for UnknownCriticality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "not a criticality: expected critical-plus, critical, sheddable-plus or sheddable",
        )
    }
}

impl std::error::Error for UnknownCriticality {}

impl FromStr for Criticality {
    type Err = UnknownCriticality;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s.as_bytes()).ok_or(UnknownCriticality)
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};

    use super::*;

    #[test]
    fn every_level_reads_back_what_it_writes_in_any_case() {
        for level in Criticality::ALL {
            assert_eq!(Criticality::parse(level.as_str().as_bytes()), Some(level));
            let upper = level.as_str().to_ascii_uppercase().replace('-', "_");
            assert_eq!(Criticality::parse(upper.as_bytes()), Some(level));
            assert_eq!(level.header_value(), level.as_str());
            assert_eq!(Criticality::ALL[level.rank()], level);
        }
        assert!(Criticality::ALL.is_sorted());
    }

    #[test]
    fn junk_is_no_level_and_never_a_panic() {
        let junk: [&[u8]; 12] = [
            b"",
            b" ",
            b"critical plus",
            b"critical-",
            b"-critical",
            b"criticalplus",
            b"critical-plus-plus-plus",
            b"1",
            b"\xff\xfe",
            b"sheddable,critical",
            b"CRITICAL-PLUS\x00",
            b"urgent",
        ];
        for value in junk {
            assert_eq!(Criticality::parse(value), None, "{value:?}");
        }
        assert_eq!(
            Criticality::parse(b"  critical\t"),
            Some(Criticality::Critical)
        );
    }

    #[test]
    fn a_repeated_header_counts_only_when_every_copy_agrees() {
        let mut headers = HeaderMap::new();
        headers.append(X_REQUEST_CRITICALITY, HeaderValue::from_static("sheddable"));
        headers.append(X_REQUEST_CRITICALITY, HeaderValue::from_static("SHEDDABLE"));
        assert_eq!(
            Criticality::from_headers(&headers),
            Some(Criticality::Sheddable)
        );
        assert!(!Criticality::is_malformed_in(&headers));
        headers.append(X_REQUEST_CRITICALITY, HeaderValue::from_static("junk"));
        assert_eq!(Criticality::from_headers(&headers), None);
        assert!(Criticality::is_malformed_in(&headers));
        assert!(!Criticality::is_malformed_in(&HeaderMap::new()));
    }
}
