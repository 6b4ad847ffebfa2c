//! The limits file's content: [`Limits`], parsed and validated, and its errors.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::HeaderName;
use serde::Deserialize;
use toml::Spanned;

use crate::algorithm::TokenBucket;
use crate::config::KeyBy;

/// The limits a file sets, validated: a [`EntryLimit`] for the default, each route and each
/// tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    default: EntryLimit,
    exact: BTreeMap<String, EntryLimit>,
    /// Longest first.
    prefixes: Vec<(String, EntryLimit)>,
    tenant_header: Option<HeaderName>,
    tenants: BTreeMap<String, EntryLimit>,
}

/// One limit of the file: its token bucket, and what it limits separately.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryLimit {
    /// The rate, period and burst.
    pub bucket: TokenBucket,
    /// What is limited separately: each client IP address ([`KeyBy::Ip`], the default of
    /// `[default]` and of the routes) or all the entry's requests together
    /// ([`KeyBy::Global`], the default of a tenant: one bucket per tenant).
    pub key: KeyBy,
}

/// Which entry of the file a request's limit comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryId<'a> {
    /// `[default]`.
    Default,
    /// The `[[route]]` with `exact` this path.
    Exact(&'a str),
    /// The `[[route]]` with `prefix` this prefix.
    Prefix(&'a str),
    /// `[tenant.<name>]`.
    Tenant(&'a str),
}

impl fmt::Display for EntryId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::Exact(path) => write!(f, "route exact {path:?}"),
            Self::Prefix(prefix) => write!(f, "route prefix {prefix:?}"),
            Self::Tenant(tenant) => write!(f, "tenant {tenant:?}"),
        }
    }
}

/// Why a limits file was refused: where (`path:line:column`) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitsFileError {
    pub(super) path: PathBuf,
    /// 1-based line and column; `None` when the file could not be read.
    pub(super) position: Option<(usize, usize)>,
    pub(super) message: String,
}

impl LimitsFileError {
    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The 1-based line and column of the error, `None` when the file could not be read.
    pub fn position(&self) -> Option<(usize, usize)> {
        self.position
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for LimitsFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, column)) => write!(
                f,
                "{}:{line}:{column}: {}",
                self.path.display(),
                self.message
            ),
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

impl std::error::Error for LimitsFileError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    tenant_header: Option<Spanned<String>>,
    default: Spanned<LimitDoc>,
    #[serde(default)]
    route: Vec<Spanned<RouteDoc>>,
    #[serde(default)]
    tenant: BTreeMap<String, Spanned<LimitDoc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitDoc {
    rate: Spanned<u32>,
    period: Option<Spanned<String>>,
    burst: Option<Spanned<u32>>,
    key: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteDoc {
    exact: Option<String>,
    prefix: Option<String>,
    rate: Spanned<u32>,
    period: Option<Spanned<String>>,
    burst: Option<Spanned<u32>>,
    key: Option<Spanned<String>>,
}

impl Limits {
    /// Reads and validates the file at `path`.
    ///
    /// # Errors
    ///
    /// The file cannot be read, is not TOML, or sets anything invalid: the first error, with
    /// its line and column.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LimitsFileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| LimitsFileError {
            path: path.to_owned(),
            position: None,
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(path, &text)
    }

    /// Validates `text`, the content of the file at `path` (named in errors only).
    ///
    /// # Errors
    ///
    /// As [`load`](Self::load).
    pub fn parse(path: impl AsRef<Path>, text: &str) -> Result<Self, LimitsFileError> {
        let err = |span: Option<Range<usize>>, message: String| LimitsFileError {
            path: path.as_ref().to_owned(),
            position: Some(span.map_or((1, 1), |s| line_column(text, s.start))),
            message,
        };
        let doc: FileDoc =
            toml::from_str(text).map_err(|e| err(e.span(), e.message().trim_end().to_owned()))?;
        // A limit's bucket; an error points at the setting it names.
        let bucket = |what: &str,
                      rate: &Spanned<u32>,
                      period: Option<&Spanned<String>>,
                      burst: Option<&Spanned<u32>>|
         -> Result<TokenBucket, LimitsFileError> {
            let period_value = match period {
                None => TokenBucket::DEFAULT_PERIOD,
                Some(p) => parse_duration(p.get_ref()).ok_or_else(|| {
                    err(
                        Some(p.span()),
                        format!(
                            "{what}: period: cannot read {:?} as a duration such as \"1s\" or \"250ms\"",
                            p.get_ref()
                        ),
                    )
                })?,
            };
            let mut builder = TokenBucket::builder(*rate.get_ref()).period(period_value);
            if let Some(burst) = burst {
                builder = builder.burst(*burst.get_ref());
            }
            builder.build().map_err(|e| {
                let span = match e.field() {
                    "burst" => burst.map_or_else(|| rate.span(), Spanned::span),
                    "period" => period.map_or_else(|| rate.span(), Spanned::span),
                    _ => rate.span(),
                };
                err(Some(span), format!("{what}: {e}"))
            })
        };
        // What an entry limits separately; an error points at the value.
        let key_by = |what: &str, key: Option<&Spanned<String>>, default: KeyBy| {
            match key {
            None => Ok(default),
            Some(k) => k.get_ref().parse::<KeyBy>().map_err(|_| {
                err(
                    Some(k.span()),
                    format!(
                        "{what}: key: {:?} is neither \"ip\" (each client IP address) nor \"global\" (all together)",
                        k.get_ref()
                    ),
                )
            }),
        }
        };
        let limit = |what: &str, doc: &Spanned<LimitDoc>, default: KeyBy| {
            let l = doc.get_ref();
            Ok::<_, LimitsFileError>(EntryLimit {
                bucket: bucket(what, &l.rate, l.period.as_ref(), l.burst.as_ref())?,
                key: key_by(what, l.key.as_ref(), default)?,
            })
        };
        let default = limit("[default]", &doc.default, KeyBy::Ip)?;
        let mut exact = BTreeMap::new();
        let mut prefixes = Vec::new();
        for route in &doc.route {
            let r = route.get_ref();
            let (path, is_exact) = match (&r.exact, &r.prefix) {
                (Some(p), None) => (p, true),
                (None, Some(p)) => (p, false),
                _ => {
                    return Err(err(
                        Some(route.span()),
                        "[[route]]: set exactly one of `exact` and `prefix`".into(),
                    ));
                }
            };
            let what = format!("[[route]] {path:?}");
            if !path.starts_with('/') {
                return Err(err(
                    Some(route.span()),
                    format!("{what}: a route's path must start with '/'"),
                ));
            }
            let limit = EntryLimit {
                bucket: bucket(&what, &r.rate, r.period.as_ref(), r.burst.as_ref())?,
                key: key_by(&what, r.key.as_ref(), KeyBy::Ip)?,
            };
            let duplicate = if is_exact {
                exact.insert(path.clone(), limit).is_some()
            } else if prefixes.iter().any(|(p, _)| p == path) {
                true
            } else {
                prefixes.push((path.clone(), limit));
                false
            };
            if duplicate {
                return Err(err(Some(route.span()), format!("{what}: set twice")));
            }
        }
        prefixes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        let tenant_header = match &doc.tenant_header {
            None => None,
            Some(h) => Some(HeaderName::try_from(h.get_ref().as_str()).map_err(|_| {
                err(
                    Some(h.span()),
                    format!("tenant_header: {:?} is not a header name", h.get_ref()),
                )
            })?),
        };
        let mut tenants = BTreeMap::new();
        for (key, doc) in &doc.tenant {
            if tenant_header.is_none() {
                return Err(err(
                    Some(doc.span()),
                    format!("[tenant.{key}]: tenants need `tenant_header`, the header naming them"),
                ));
            }
            tenants.insert(
                key.clone(),
                limit(&format!("[tenant.{key}]"), doc, KeyBy::Global)?,
            );
        }
        Ok(Self {
            default,
            exact,
            prefixes,
            tenant_header,
            tenants,
        })
    }

    /// The header whose value names a request's tenant, if the file names one.
    pub fn tenant_header(&self) -> Option<&HeaderName> {
        self.tenant_header.as_ref()
    }

    /// The limit of a request for `path` from `tenant` (the value of
    /// [`tenant_header`](Self::tenant_header)): the tenant's if the file sets one, else the
    /// exact route's, else the longest prefix's, else the default.
    pub fn limit_for(&self, path: &str, tenant: Option<&str>) -> &TokenBucket {
        &self.entry_for(path, tenant).1.bucket
    }

    /// The entry a request for `path` from `tenant` takes its limit from, in the order of
    /// [`limit_for`](Self::limit_for), and its limit.
    pub fn entry_for<'a>(
        &'a self,
        path: &str,
        tenant: Option<&str>,
    ) -> (EntryId<'a>, &'a EntryLimit) {
        if let Some((name, limit)) = tenant.and_then(|t| self.tenants.get_key_value(t)) {
            return (EntryId::Tenant(name), limit);
        }
        if let Some((exact, limit)) = self.exact.get_key_value(path) {
            return (EntryId::Exact(exact), limit);
        }
        self.prefixes
            .iter()
            .find(|(prefix, _)| path.starts_with(prefix.as_str()))
            .map_or((EntryId::Default, &self.default), |(prefix, limit)| {
                (EntryId::Prefix(prefix), limit)
            })
    }

    /// Every entry of the file with its limit: the default, the exact routes, the prefixes
    /// (longest first) and the tenants.
    pub fn entries(&self) -> impl Iterator<Item = (EntryId<'_>, &EntryLimit)> {
        std::iter::once((EntryId::Default, &self.default))
            .chain(self.exact.iter().map(|(p, l)| (EntryId::Exact(p), l)))
            .chain(self.prefixes.iter().map(|(p, l)| (EntryId::Prefix(p), l)))
            .chain(self.tenants.iter().map(|(t, l)| (EntryId::Tenant(t), l)))
    }

    /// What differs from `self` to `new`, one line per limit, for the reload's log.
    pub fn changes(&self, new: &Self) -> Vec<String> {
        let show = |l: &EntryLimit| {
            let b = &l.bucket;
            let key = match l.key {
                KeyBy::Ip => "",
                KeyBy::Global => ", global",
            };
            format!("{}/{:?} burst {}{key}", b.rate(), b.period(), b.burst())
        };
        let old: BTreeMap<EntryId<'_>, &EntryLimit> = self.entries().collect();
        let next: BTreeMap<EntryId<'_>, &EntryLimit> = new.entries().collect();
        let mut ids: Vec<EntryId<'_>> = old.keys().chain(next.keys()).copied().collect();
        ids.sort();
        ids.dedup();
        let mut out = Vec::new();
        for id in ids {
            match (old.get(&id), next.get(&id)) {
                (Some(o), Some(n)) if o != n => {
                    out.push(format!("{id}: {} -> {}", show(o), show(n)));
                }
                (Some(o), None) => out.push(format!("{id}: {} removed", show(o))),
                (None, Some(n)) => out.push(format!("{id}: {} added", show(n))),
                _ => {}
            }
        }
        if self.tenant_header != new.tenant_header {
            out.push(format!(
                "tenant_header: {:?} -> {:?}",
                self.tenant_header, new.tenant_header
            ));
        }
        out
    }
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// A duration written as a whole number and a unit: `ns`, `us`, `ms`, `s`, `m` or `h`.
pub(super) fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    match unit.trim() {
        "ns" => Some(Duration::from_nanos(n)),
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3_600).map(Duration::from_secs),
        _ => None,
    }
}
